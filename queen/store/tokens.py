"""API tokens as stored: hashes, roles, queue globs and rates (migration 0005)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Iterator

from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from queen.errors import Unavailable
from queen.store.db import Database


@contextlib.contextmanager
def _migrated() -> Iterator[None]:
    """Name the fix when the database predates migration 0005."""
    try:
        yield
    except pg_errors.UndefinedTable as exc:
        raise Unavailable("the database has no tokens yet: run `queen migrate` first") from exc


@dataclasses.dataclass(frozen=True, slots=True)
class StoredToken:
    """A live token found by its hash."""

    name: str
    token_hash: bytes
    role: str
    queues: str  # comma-separated globs
    rate: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as listed (never its hash)."""

    name: str
    role: str
    queues: str
    rate: float | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None


class Tokens:
    """Create, find, list and revoke tokens."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def create(
        self, name: str, token_hash: bytes, role: str, queues: str, rate: float | None
    ) -> bool:
        """Store a token; False when the name is taken (by a live or a revoked token)."""
        params = {
            "name": name,
            "token_hash": token_hash,
            "role": role,
            "queues": queues,
            "rate": rate,
        }
        with _migrated():
            return bool(self.db.fetch("token_create", params))

    def find(self, token_hash: bytes) -> StoredToken | None:
        """Return the live token with this hash, or None."""
        with _migrated():
            rows = self.db.fetch("token_find", {"token_hash": token_hash}, dict_row)
        if not rows:
            return None
        row = rows[0]
        return StoredToken(
            name=row["name"],
            token_hash=bytes(row["token_hash"]),
            role=row["role"],
            queues=row["queues"],
            rate=row["rate"],
        )

    def list(self) -> list[TokenInfo]:
        with _migrated():
            rows = self.db.fetch("token_list", None, dict_row)
        return [TokenInfo(**row) for row in rows]

    def revoke(self, name: str) -> bool:
        """Revoke a live token; False when there is none of that name."""
        with _migrated():
            return bool(self.db.fetch("token_revoke", {"name": name}))
