"""Leases a consumer keeps alive while it works."""

from __future__ import annotations

import datetime as dt
import uuid

from queen.store.db import Database


class Leases:
    """Renew partition leases."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def extend(self, lease_id: uuid.UUID, seconds: int | None) -> dt.datetime | None:
        """Move a live lease's expiry to now + seconds (None: the queue's leaseTime).

        Return the new expiry, or None when the lease is unknown, ended or expired.
        """
        ((expires,),) = self.db.fetch("extend_lease", {"lease": lease_id, "seconds": seconds})
        return expires  # type: ignore[no-any-return]

    def queue_of(self, lease_id: uuid.UUID) -> str | None:
        """Return the queue the lease is on, or None when no partition holds it."""
        rows = self.db.fetch("lease_queue", {"lease": lease_id})
        return rows[0][0] if rows else None
