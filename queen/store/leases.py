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
        params = {"lease": lease_id, "seconds": seconds}
        ((expires,),) = self.db.fetch("extend_lease", params)
        return expires  # type: ignore[no-any-return]

    def queue_of(self, lease_id: uuid.UUID) -> str | None:
        """Return the queue the lease is on, or None when no partition holds it."""
        ((queue,),) = self.db.fetch("lease_queue", {"lease": lease_id})
        return queue  # type: ignore[no-any-return]
