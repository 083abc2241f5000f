"""Errors of the Queen client, one tree with QueenError at its root::

QueenError
├── TransportError          no answer from the server
│   ├── Unreachable         could not connect to any base URL: nothing was sent
│   └── ResponseLost        sent, but the answer never came (timeout, reset):
│                           the request may or may not have taken effect
└── APIError                the server answered 4xx or 5xx (.status, .message)
    ├── BadRequest          400: invalid parameters or body
    ├── Unauthorized        401: no token, or an unknown one
    ├── Forbidden           403: the token may not do this
    ├── NotFound            404: no such queue, message, lease or group
    ├── Conflict            409: not in a state that allows this (.reason says why)
    │   ├── NotLeased       an ack of a message not under any lease (of its group)
    │   ├── LeaseExpired    an ack under a lease that ended before the message was done
    │   ├── LeasedByOther   an ack under a lease that ended: another consumer holds it
    │   └── AlreadyAcknowledged  a transaction's ack of a message acknowledged before,
    │                       not by this transaction (nothing of it was applied)
    ├── PayloadTooLarge     413
    ├── RateLimited         429: slow down (.retry_after, seconds or None); a push
    │                       whose every item a full queue (maxSize) rejected, too
    └── ServerError         5xx
        └── Unavailable     503: PostgreSQL unreachable or busy; retried
"""

from __future__ import annotations

from typing import Any


class QueenError(Exception):
    """Queen client error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class TransportError(QueenError):
    """No answer from the server."""


class Unreachable(TransportError):
    """Could not connect to any Queen server."""


class ResponseLost(TransportError):
    """The request was sent but its answer was lost; it may have taken effect."""


class APIError(QueenError):
    """The server answered with an error."""

    def __init__(self, message: str | None = None, status: int = 0, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body

    @property
    def reason(self) -> str | None:
        """The answer's reason (an ack's: not_leased, lease_expired, ...), if it gave one."""
        reason = self.body.get("reason") if isinstance(self.body, dict) else None
        return str(reason) if reason is not None else None


class BadRequest(APIError):
    """Invalid request."""


class Unauthorized(APIError):
    """Not authenticated."""


class Forbidden(APIError):
    """Not allowed."""


class NotFound(APIError):
    """Not found."""


class Conflict(APIError):
    """The resource is not in a state that allows this."""


class NotLeased(Conflict):
    """The message is not leased (to this consumer group): nothing changed."""


class LeaseExpired(Conflict):
    """The lease ended before the message was done: nothing changed."""


class LeasedByOther(Conflict):
    """The lease ended and another consumer holds the message now: nothing changed."""


class AlreadyAcknowledged(Conflict):
    """The message was acknowledged before, not by this transaction: nothing was applied."""


class PayloadTooLarge(APIError):
    """Request body too large."""


class RateLimited(APIError):
    """Too many requests."""

    def __init__(
        self,
        message: str | None = None,
        status: int = 429,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status, body)
        self.retry_after = retry_after


class ServerError(APIError):
    """The server failed."""


class Unavailable(ServerError):
    """The server is unavailable; retry."""

    retry_after: float | None = None  # the answer's Retry-After, seconds


ERROR_OF_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: RateLimited,
    503: Unavailable,
}


# A 409's error by the reason it gives.
CONFLICT_OF_REASON: dict[str, type[Conflict]] = {
    "not_leased": NotLeased,
    "lease_expired": LeaseExpired,
    "leased_by_other": LeasedByOther,
    "already_completed": AlreadyAcknowledged,
    "already_failed": AlreadyAcknowledged,
}


def error_for(status: int, body: Any, retry_after: float | None = None) -> APIError:
    """Return the typed error of an error response (its JSON body, if any, as body)."""
    message = body.get("error") if isinstance(body, dict) else None
    text = str(message) if message else f"HTTP {status}"
    if status == 429:
        return RateLimited(text, status, body, retry_after)
    cls = ERROR_OF_STATUS.get(status) or (ServerError if status >= 500 else APIError)
    if status == 409 and isinstance(body, dict):
        cls = CONFLICT_OF_REASON.get(str(body.get("reason")), cls)
    error = cls(text, status, body)
    if isinstance(error, Unavailable):
        error.retry_after = retry_after
    return error
