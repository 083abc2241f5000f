"""The connection pool and the one place that turns driver errors into queen.errors."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.rows import RowFactory, tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout

from queen.errors import InvalidInput, Unavailable
from queen.store.sqlfile import load_queries

log = logging.getLogger(__name__)

QUERIES = load_queries()
RETRIES_ON_DEADLOCK = 3
# The pool doubles the pause between connection attempts for this long, then gives up
# until the next request asks again (and starts over at 1 s). Without a bound the pause
# grows with the outage: after 10 minutes down, the next attempt could be 8 minutes away.
RECONNECT_WINDOW_S = 5.0
# Class 40: the statement was rolled back and may simply be run again. psycopg derives
# these from OperationalError, not from TransactionRollback, so they are listed.
RETRYABLE = (
    pg_errors.TransactionRollback,
    pg_errors.DeadlockDetected,
    pg_errors.SerializationFailure,
)


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise driver errors as domain errors, keeping the original as __cause__."""
    try:
        yield
    except PoolTimeout as exc:
        raise Unavailable("no database connection available") from exc
    except RETRYABLE:
        raise  # deadlock or serialization failure: Database.fetch retries
    except pg_errors.QueryCanceled as exc:
        raise Unavailable("database statement timed out") from exc
    except pg_errors.DataError as exc:
        # Class 22: a value the client sent cannot be stored (NUL in text, bad unicode…).
        detail = exc.diag.message_primary or "invalid value"
        raise InvalidInput(f"invalid input: {detail}") from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise Unavailable("database unavailable") from exc


def returns_rows(cursor: psycopg.Cursor[Any]) -> bool:
    """Tell whether the statement just run returned rows (a result set, even empty).

    Cheaper than `cursor.description`, which builds an object per column at each call.
    """
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


class LifoPool(ConnectionPool):
    """A ConnectionPool that hands out the connection returned last.

    psycopg_pool hands out the connection idle longest, so consecutive requests rotate
    through every pooled backend, and at low load each one finds its backend asleep
    and its caches cold: a pop function call every 5 ms through a pool of 10 took
    0.58-0.87 ms p50 that way, against 0.36 ms on the connection used last. Idle
    connections still close oldest first (max_idle), from the other end.
    tests/integration/test_lifo_pool.py fails if psycopg_pool stops calling this method.
    """

    def _get_ready_connection(self, timeout: float | None) -> Any:
        if self._pool and (timeout is None or timeout > 0.0):
            conn = self._pool.pop()  # the newest, where the base class takes the oldest
            if len(self._pool) < self._nconns_min:
                self._nconns_min = len(self._pool)
            return conn
        return super()._get_ready_connection(timeout)


class Database:
    """A psycopg pool with named queries; create one per process, after fork."""

    def __init__(
        self,
        dsn: str,
        *,
        pool_size: int = 10,
        timeout_s: float = 5.0,
        statement_timeout_ms: int = 30000,
        application_name: str = "queen",
    ) -> None:
        self.dsn = dsn
        self.queries = QUERIES
        self._statement_timeout_ms = statement_timeout_ms
        self.pool = LifoPool(
            dsn,
            min_size=1,
            max_size=max(1, pool_size),
            timeout=timeout_s,
            open=False,
            name=application_name,
            kwargs={"autocommit": True, "application_name": application_name},
            configure=self._configure,
            reconnect_timeout=RECONNECT_WINDOW_S,
        )

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', '60s', false),"
            # Timestamps arrive in UTC, ready to format (queen.models.iso).
            " set_config('TimeZone', 'UTC', false),"
            # Pushes wake long polls after they commit (queen.store.polling.PushWakeups).
            " set_config('queen.push_notify', 'after_commit', false)",
            (str(self._statement_timeout_ms),),
        )

    def open(self) -> None:
        """Start the pool without waiting for the database (requests answer 503 until it is up)."""
        self.pool.open(wait=False)

    def close(self) -> None:
        self.pool.close()

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """Borrow an autocommit connection, with errors translated."""
        with translate_errors(), self.pool.connection() as conn:
            yield conn

    def fetch(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        row_factory: RowFactory[Any] = tuple_row,
        *,
        raw_json: bool = False,
    ) -> list[Any]:
        """Run the named query and return all rows; retry deadlocks (each call is atomic)."""
        for attempt in range(RETRIES_ON_DEADLOCK):
            try:
                with self.connection() as conn:
                    cur = conn.cursor(row_factory=row_factory)
                    if raw_json:
                        cur.adapters.register_loader("jsonb", psycopg.types.string.TextLoader)
                    cur.execute(QUERIES[name], params)
                    return cur.fetchall() if returns_rows(cur) else []
            except RETRYABLE as exc:
                if attempt == RETRIES_ON_DEADLOCK - 1:
                    raise Unavailable("database busy (deadlock), retry") from exc
                log.warning("retrying %s after %s", name, type(exc).__name__)
        raise AssertionError("unreachable")

    def stats(self) -> dict[str, int]:
        """Return the pool's size, idle and waiting counts."""
        s = self.pool.get_stats()
        return {
            "size": s.get("pool_size", 0),
            "idle": s.get("pool_available", 0),
            "waiting": s.get("requests_waiting", 0),
            "max": self.pool.max_size,
        }
