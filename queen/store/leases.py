"""Leases a consumer keeps alive while it works; concurrent renewals share one call."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import NamedTuple

from queen.fusion import FUSED_CALLS, Fuser, Observe, Trace, untraced
from queen.server.turns import Turns
from queen.store.db import Database

FUSED_EXTENDS = 100  # renewals per fused call


class _Extend(NamedTuple):
    lease: uuid.UUID
    seconds: int | None


class Leases:
    """Renew partition leases."""

    def __init__(self, db: Database, fused_calls: int = FUSED_CALLS) -> None:
        self.db = db
        self.observe: Observe = lambda kind, requests: None
        self.trace: Trace = untraced
        self._extends: Fuser[_Extend, dt.datetime | None] = Fuser(
            "extend", self._extend_call, max_calls=fused_calls, limit=FUSED_EXTENDS,
            observe=lambda kind, requests: self.observe(kind, requests),
            trace=lambda kind, requests: self.trace(kind, requests),
        )

    def take_turns(self, turns: Turns) -> None:
        self._extends.turn = turns.of("extend")

    def extend(self, lease_id: uuid.UUID, seconds: int | None) -> dt.datetime | None:
        """Move a live lease's expiry to now + seconds (None: the queue's leaseTime).

        Return the new expiry, or None when the lease is unknown, ended or expired.
        """
        return self._extends.submit(_Extend(lease_id, seconds))

    def _extend_call(self, requests: list[_Extend]) -> list[dt.datetime | None]:
        params = {"leases": [r.lease for r in requests], "seconds": [r.seconds for r in requests]}
        rows = self.db.fetch("extend_leases", params)
        return [expires for _, expires in rows]

    def queue_of(self, lease_id: uuid.UUID) -> str | None:
        """Return the queue the lease is on, or None when no partition holds it."""
        ((queue,),) = self.db.fetch("lease_queue", {"lease": lease_id})
        return queue  # type: ignore[no-any-return]
