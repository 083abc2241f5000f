"""Request fusion: requests of one kind that wait while calls of that kind are in flight
share the next database call.

A worker runs at most `max_calls` calls of a kind at once. A request that finds fewer in
flight goes at once, alone: nothing waits when there is nothing to fuse, and no timer
holds a call back. A request that finds them all busy joins the queue of that kind; when
a call ends, the oldest waiting request leads the next call, which takes every request
queued by then (up to `limit`). The batch grows with the load and falls back to one
request when the load does: an adaptive window with no constant in it.

The call itself (`run`) gets the requests in arrival order and answers one result per
request, in order; a result that is an exception is raised in that request only. An
exception from `run` fails every request of that call, and only those.

A fuser given a turn (queen.server.turns: its host's workers share slots for calls) takes
it before it gathers a call's requests and gives it back once the database has answered,
so that a worker's requests that arrive during another worker's call share its next one.

Works the same under gevent (monkey-patched threading) and with real threads.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Generic, Protocol, TypeVar

from queen.errors import Unavailable

R = TypeVar("R")  # a request
T = TypeVar("T")  # its result

# Calls of one kind a worker runs at once; requests arriving meanwhile fuse into the next.
# One: a second call in flight made PostgreSQL do more work a message, not less
# (docs/DECISIONS.md, request fusion).
FUSED_CALLS = 1

Observe = Callable[[str, int], None]
# trace(kind, requests): a context manager around each call (a tracing span), or none.
Trace = Callable[[str, int], AbstractContextManager[object]]
_NO_SPAN = contextlib.nullcontext()


class Turn(Protocol):
    """Taken before a call gathers its requests, given back once the database has answered
    it (queen.server.turns)."""

    def take(self) -> None: ...

    def give(self) -> None: ...


def untraced(kind: str, requests: int) -> AbstractContextManager[object]:
    return _NO_SPAN


def _ignore(kind: str, size: int) -> None:
    return None


class _Entry(Generic[R, T]):
    __slots__ = ("request", "size", "done", "leads", "result", "error")

    def __init__(self, request: R, size: int) -> None:
        self.request = request
        self.size = size
        self.done = threading.Event()
        self.leads = False  # set when this entry is to run the next call itself
        self.result: T | None = None
        self.error: BaseException | None = None


class Fuser(Generic[R, T]):
    """Fuse the concurrent requests of one kind into shared calls of `run`.

    size: a request's weight against limit (items of a push, 1 for a pop...). A call takes
    queued requests in order while their sizes add up to at most limit; the first
    request of a call always goes, whatever its size.
    observe(kind, requests): told the number of requests of every call made.
    trace(kind, requests): a context manager entered around every call made.
    turn: taken before a call gathers its requests, given back once it has run, or once
    run calls answered() (None: no turn to take). Settable later.
    """

    def __init__(
        self,
        kind: str,
        run: Callable[[list[R]], Sequence[T | BaseException]],
        *,
        max_calls: int,
        limit: int,
        size: Callable[[R], int] = lambda request: 1,
        observe: Observe = _ignore,
        trace: Trace = untraced,
        turn: Turn | None = None,
    ) -> None:
        if max_calls < 0:
            raise ValueError("max_calls must be 0 (no fusion) or more")
        self.kind = kind
        self.max_calls = max_calls
        self.limit = limit
        self.run = run
        self._size = size
        self.observe = observe
        self.trace = trace
        self.turn = turn
        self._turn_held: Turn | None = None  # the running call's, until given back
        self._lock = threading.Lock()
        self._running = 0
        self._queued: deque[_Entry[R, T]] = deque()

    def submit(self, request: R) -> T:
        """Run request in a call of its own or with others; return its result.

        max_calls 0: no fusion, every request a call of its own, however many run.
        """
        entry: _Entry[R, T] = _Entry(request, self._size(request))
        if self.max_calls == 0:
            self._call([entry], hand_on=False)
            if entry.error is not None:
                raise entry.error
            return entry.result  # type: ignore[return-value]
        with self._lock:
            # While fewer calls than max_calls run, nothing is queued: go at once.
            alone = self._running < self.max_calls
            if alone:
                self._running += 1
            else:
                self._queued.append(entry)
        if alone:
            self._lead(entry)
        else:
            try:
                entry.done.wait()
            except BaseException:  # killed while waiting: leave no slot or turn behind
                self._abandon(entry)
                raise
            if entry.leads:
                self._lead(entry)
        if entry.error is not None:
            raise entry.error
        return entry.result  # type: ignore[return-value]

    def _take(self, leader: _Entry[R, T]) -> list[_Entry[R, T]]:
        """The leader and the queued requests that fit in its call, in arrival order."""
        batch = [leader]
        total = leader.size
        with self._lock:
            while self._queued and total + self._queued[0].size <= self.limit:
                entry = self._queued.popleft()
                batch.append(entry)
                total += entry.size
        return batch

    def _lead(self, leader: _Entry[R, T]) -> None:
        """Run the next call, led by leader: with the turn taken, if there is one."""
        turn = self.turn
        if turn is None:
            self._call(self._take(leader))
            return
        try:
            turn.take()
        except BaseException:  # killed while waiting: the next request leads
            leader.error = Unavailable("call ended")
            self._next()
            raise
        self._turn_held = turn
        self._call(self._take(leader))

    def answered(self) -> None:
        """The database has answered the running call (run calls this): give the host's turn
        back now; what is left of the call is this worker's own work."""
        turn, self._turn_held = self._turn_held, None
        if turn is not None:
            turn.give()

    def _call(self, batch: list[_Entry[R, T]], hand_on: bool = True) -> None:
        """Run one call for batch (this greenlet is batch[0]'s) and hand out its results;
        hand_on: then let the next queued request lead (not without fusion: no slot taken).
        The turn the caller took is given back once run has returned, if not before."""
        try:
            try:
                self.observe(self.kind, len(batch))
                with self.trace(self.kind, len(batch)):
                    results = self.run([e.request for e in batch])
            finally:
                self.answered()
            if len(results) != len(batch):
                raise RuntimeError(f"{self.kind} call answered {len(results)} of {len(batch)}")
            for entry, result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    entry.error = result
                else:
                    entry.result = result
        except BaseException as exc:  # noqa: BLE001 - every request of the call must hear
            for entry in batch:
                entry.error = exc if isinstance(exc, Exception) else Unavailable("call ended")
            if not isinstance(exc, Exception):
                batch[0].error = exc  # the leader's own greenlet re-raises a kill
        finally:
            for entry in batch[1:]:
                entry.done.set()
            if hand_on:
                self._next()

    def _abandon(self, entry: _Entry[R, T]) -> None:
        """Forget a request whose greenlet was killed while it waited."""
        with self._lock:
            if entry in self._queued:
                self._queued.remove(entry)
                return
        if entry.leads:  # it was to lead the next call: let the next request lead instead
            self._next()

    def _next(self) -> None:
        """A call ended: let the oldest queued request lead the next one."""
        with self._lock:
            if not self._queued:
                self._running -= 1
                return
            leader = self._queued.popleft()  # the running count stays: it takes this slot
        leader.leads = True
        leader.done.set()


def split(results: Sequence[T], sizes: Sequence[int]) -> list[list[T]]:
    """Cut a fused call's results (one per item, in item order) into each request's own."""
    parts: list[list[T]] = []
    start = 0
    for size in sizes:
        parts.append(list(results[start : start + size]))
        start += size
    if start != len(results):
        raise RuntimeError(f"fused call answered {len(results)} rows for {start} items")
    return parts
