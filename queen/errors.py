"""Domain errors. Each class's docstring is its default message; none knows about HTTP."""

from __future__ import annotations


class QueenError(Exception):
    """Queen error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class InvalidInput(QueenError):
    """Invalid request."""


class NotFound(QueenError):
    """Not found."""


class Conflict(QueenError):
    """The resource is not in a state that allows this."""


class QueueFull(QueenError):
    """The queue is full."""


class PayloadTooLarge(QueenError):
    """Request body too large."""


class Unavailable(QueenError):
    """The database is unavailable."""


class OperationFailed(QueenError):
    """An operation of a transaction could not be applied, so none was."""

    def __init__(
        self, index: int, reason: type[QueenError], message: str, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.index = index  # the operation's position in the request, from 0
        self.reason = reason  # the error it is (InvalidInput, NotFound, Conflict, QueueFull)
        self.code = code  # an acknowledgment's reason (not_leased, lease_expired, ...)
