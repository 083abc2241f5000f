"""Read sessions for the analytics, resources and message-browsing endpoints.

These reads must never starve or slow the hot paths: each runs in a short transaction
under its own statement timeout (a long snapshot holds back vacuum, see NOTES), and at
most a few run at once per process, so a burst of dashboard polls cannot take every
pooled connection away from push, pop and ack.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
from psycopg.rows import RowFactory, dict_row

from queen.errors import Unavailable
from queen.store.db import Database, returns_rows

READ_STATEMENT_TIMEOUT_MS = 10_000
READ_CONCURRENCY = 4  # concurrent read sessions per process


class ReadSession:
    """Named queries on one connection, inside one short transaction."""

    def __init__(self, conn: psycopg.Connection[Any], queries: Mapping[str, str]) -> None:
        self._conn = conn
        self._queries = queries

    def rows(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        row_factory: RowFactory[Any] = dict_row,
        *,
        raw_json: bool = False,
    ) -> list[Any]:
        """Run a named query and return its rows.

        Statements are never server-prepared: each is planned with its actual values
        (a generic plan cannot tell a filter that keeps 5 rows from one that keeps 5M).
        """
        cur = self._conn.cursor(row_factory=row_factory)
        if raw_json:
            cur.adapters.register_loader("jsonb", psycopg.types.string.TextLoader)
        cur.execute(self._queries[name], params, prepare=False)
        return cur.fetchall() if returns_rows(cur) else []


class Reads:
    """Open read sessions: bounded per process, each under a statement timeout."""

    def __init__(
        self,
        db: Database,
        *,
        concurrency: int = READ_CONCURRENCY,
        statement_timeout_ms: int = READ_STATEMENT_TIMEOUT_MS,
        wait_s: float = 5.0,
    ) -> None:
        self.db = db
        self._slots = threading.BoundedSemaphore(concurrency)
        self._timeout_ms = statement_timeout_ms
        self._wait_s = wait_s

    @contextlib.contextmanager
    def session(self) -> Iterator[ReadSession]:
        if not self._slots.acquire(timeout=self._wait_s):
            raise Unavailable("too many analytics queries in flight, retry")
        try:
            with (
                self.db.connection(timeout_ms=self._timeout_ms) as conn,
                conn.transaction(),
            ):
                conn.execute(self.db.queries["read_session"], {"ms": str(self._timeout_ms)})
                yield ReadSession(conn, self.db.queries)
        finally:
            self._slots.release()

    def rows(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        row_factory: RowFactory[Any] = dict_row,
        *,
        raw_json: bool = False,
    ) -> list[Any]:
        """Run one named query in its own session."""
        with self.session() as session:
            return session.rows(name, params, row_factory, raw_json=raw_json)
