"""Lease renewal: a consumer keeps its messages while a handler runs."""

from __future__ import annotations

import uuid

import falcon

from queen.api import auth, read_body, send_json, validation
from queen.errors import InvalidInput, NotFound
from queen.models import iso
from queen.store import Store

MAX_SECONDS = validation.MAX_INT


def lease_id(value: str) -> uuid.UUID:
    """Check a leaseId taken from the path."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidInput("leaseId must be a UUID") from None


def seconds(raw: bytes) -> int | None:
    """Read {"seconds": N} (1 <= N); an empty body or no seconds means the queue's leaseTime."""
    if not raw.strip():
        return None
    value = validation.parse_json_object(raw).get("seconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SECONDS:
        raise InvalidInput(f"seconds must be an integer between 1 and {MAX_SECONDS}")
    return value


class LeaseExtendResource:
    """POST /lease/{lease_id}/extend {"seconds"?}"""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_post(self, req: falcon.Request, resp: falcon.Response, lease: str) -> None:
        wanted = lease_id(lease)
        principal = auth.principal_of(req)
        if principal is not None and principal.scoped:
            queue = self.store.leases.queue_of(wanted)
            if queue is not None:
                auth.check_queue(req, queue)
        expires = self.store.leases.extend(wanted, seconds(read_body(req)))
        if expires is None:
            raise NotFound(f"lease {lease!r} not found, ended or expired")
        stamp = iso(expires)
        # (newExpiresAt: the same, for clients of the original Queen, which read that.)
        send_json(resp, {"leaseId": str(wanted), "leaseExpiresAt": stamp, "newExpiresAt": stamp})
