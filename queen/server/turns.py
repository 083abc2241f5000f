"""Turns: the workers of one host take turns at fused calls.

Each worker fuses its own requests (queen.fusion): while its call of a kind runs, the
requests of that kind queue and share its next call. Two workers each running their own
calls split the requests between them: each call carries half as many, and PostgreSQL
runs twice the calls, each with its fixed costs (executor start-up, a commit, the
wake-ups it sends). So a worker takes a turn of its host before it gathers a call's
requests, and gives it back once the database has answered: while one worker's call
runs, the other's requests queue, and its next call takes them all, as one worker's would.

A turn is an exclusive flock on a file (one a kind, or one a slot) in the directory the
workers share with their master (QUEEN_CLAIMS_DIR): the kernel gives it back when its
holder dies. flock blocks, so a worker waits for it in a real thread (gevent's pool under
gevent) while its greenlets go on. It waits at most TURN_WAIT_S: a holder that is frozen
or stuck in a call costs its host the shared fusion, never its availability. The worker
then goes without the turn until that wait ends.

What counts most is how many calls are in flight against the database: too few leave it
short of work, too many make each shallower, and PostgreSQL pays each one's fixed costs.
So by default (QUEEN_FUSION_TURNS=auto) a host's workers share slots for calls of any
kind, a file each: the database is given QUEEN_DB_CALLS calls at once, split among the
servers its node notes show (queen.dashboard.nodes), at least one a server. kind (a turn
a kind: as many calls at once as kinds) and host (one call at a time) choose one way for
good. off, and a server without the directory (an app built in a test, another WSGI
server), take no turns: each worker fuses alone.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from queen.server.claims import CLAIMS_ENV

# Seconds a worker waits for its host's turn before it calls without it. A turn is held
# for one call, and a call ends within its deadline (queen.store.bounds).
TURN_WAIT_S = 2.0
# Seconds auto's count of the servers sharing the database holds before it is asked again.
SERVERS_TTL_S = 1.0

log = logging.getLogger(__name__)


def _patched() -> bool:
    try:
        from gevent import monkey
    except ImportError:  # pragma: no cover - gevent is a dependency
        return False
    return bool(monkey.is_module_patched("threading"))


def _real_lock() -> Callable[[], threading.Lock]:
    """A lock that works between a greenlet and a real thread (gevent's would not)."""
    if _patched():
        from gevent.monkey import get_original

        return get_original("threading", "Lock")  # type: ignore[no-any-return]
    return threading.Lock


def _in_thread(work: Callable[[], None]) -> Callable[[float], bool]:
    """Run work in a real thread; return wait(timeout) -> whether it has ended."""
    if _patched():
        from gevent import get_hub

        result = get_hub().threadpool.spawn(work)

        def wait(timeout: float) -> bool:
            result.wait(timeout)
            return bool(result.ready())

        return wait
    ended = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            ended.set()

    threading.Thread(target=run, name="queen-turn", daemon=True).start()
    return ended.wait


class _Wait:
    """A blocking flock on fd, in a thread; whoever gives up on it leaves fd to it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = _real_lock()()
        self.held = False
        self.abandoned = False
        self.ended = False  # the thread is done: fd closed, unless held
        self._wait = _in_thread(self._block)

    def _block(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            got = True
        except OSError:
            got = False
        with self._lock:
            if got and not self.abandoned:
                self.held = True
            else:
                os.close(self.fd)  # (gives the turn back if it was got too late)
            self.ended = True

    def until(self, timeout: float) -> bool:
        """Wait up to timeout for the turn; True when held, False when given up on (also
        when the waiting greenlet is killed: it then raises)."""
        try:
            self._wait(timeout)
        finally:
            with self._lock:
                if not self.held:
                    self.abandoned = True
        return self.held


class _Taken:
    """take() on entering, give() on leaving: `with turn:`."""

    def take(self) -> None:
        raise NotImplementedError

    def give(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.take()
        return self

    def __exit__(self, *exc: object) -> None:
        self.give()


class Turn(_Taken):
    """A turn among a host's workers (a file: a kind's, or a slot for calls of any kind);
    one greenlet of a worker at a time."""

    def __init__(self, path: Path, wait_s: float = TURN_WAIT_S) -> None:
        self.path = path
        self.wait_s = wait_s
        self._mine = threading.Lock()  # (gevent's under gevent) this worker's one taker
        self._fd: int | None = None
        self._stray: _Wait | None = None  # a wait given up on, not ended yet
        self._held = False

    def take(self) -> None:
        """Wait for the host's turn, or give up on it after wait_s; then call give()."""
        self._mine.acquire()
        try:
            self._held = self._take()
        except BaseException:
            self._mine.release()
            raise

    def give(self) -> None:
        try:
            if self._held and self._fd is not None:
                self._held = False
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._mine.release()

    @property
    def held(self) -> bool:
        return self._held

    @property
    def here(self) -> bool:
        """Whether a greenlet of this worker has it or waits for it."""
        return self._mine.locked()

    def try_take(self) -> bool:
        """Take the host's turn if it is free now, without waiting; True: it is held, and
        give() gives it back."""
        if not self._mine.acquire(blocking=False):
            return False
        try:
            self._held = self._take(wait=False)
        except BaseException:
            self._mine.release()
            raise
        if not self._held:
            self._mine.release()
        return self._held

    def _take(self, wait: bool = True) -> bool:
        if self._stray is not None:
            if not self._stray.ended:
                return False  # still waiting out a stuck holder: go without
            self._stray = None
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if not wait:
                return False
        waiting = _Wait(self._fd)
        try:
            if waiting.until(self.wait_s):
                return True
        except BaseException:  # killed while waiting
            if waiting.held:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            else:
                self._stray, self._fd = waiting, None
            raise
        log.warning(
            "no %s turn after %.1f s (another worker is stuck in a call or frozen): "
            "calling without it until it ends",
            self.path.stem,
            self.wait_s,
        )
        self._stray, self._fd = waiting, None  # the wait closes its fd when it ends
        return False


class Calls(_Taken):
    """A slot among a host's first count() for calls of any kind (a Turn each, a file per
    slot): at most that many calls at once on the host. A free slot is taken at once;
    when none is, a random one of them is waited for. One greenlet of a worker at a time
    (one kind's fuser), so that give() gives back the slot taken."""

    def __init__(self, slot: Callable[[int], Turn], count: Callable[[], int]) -> None:
        self.slot = slot
        self.count = count
        self._mine = threading.Lock()
        self._taken: Turn | None = None

    def take(self) -> None:
        self._mine.acquire()
        try:
            count = self.count()
            start = random.randrange(count)
            order = [self.slot((start + i) % count) for i in range(count)]
            turn = next((t for t in order if t.try_take()), None)
            if turn is None:  # (one this worker's other kinds hold is waited for last)
                turn = next((t for t in order if not t.here), order[0])
                turn.take()
        except BaseException:
            self._mine.release()
            raise
        self._taken = turn

    def give(self) -> None:
        turn, self._taken = self._taken, None
        try:
            if turn is not None:
                turn.give()
        finally:
            self._mine.release()

    @property
    def held(self) -> bool:
        return self._taken is not None and self._taken.held


class Turns:
    """A worker's turns in its host's shared directory: one per kind of fused call, or one
    for every kind (shared: one call of any kind at a time on the host), or (calls given:
    auto) slots for calls of any kind, the host's share of the calls the database is
    given at once (calls, split among the servers() sharing it; at least one)."""

    def __init__(
        self,
        directory: Path | None,
        wait_s: float = TURN_WAIT_S,
        shared: bool = False,
        calls: int = 0,
        servers: Callable[[], int] = lambda: 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.wait_s = wait_s
        self.shared = shared
        self.calls = calls
        self.servers = servers
        self.clock = clock
        self._turns: dict[str, Turn] = {}
        self._calls: dict[str, Calls] = {}
        self._share = (float("-inf"), 1)  # (asked at, this host's calls at once)

    def of(self, kind: str) -> Turn | Calls | None:
        """kind's turn; None without a directory (the worker fuses alone)."""
        if self.directory is None:
            return None
        if self.shared:
            return self._turn("call")
        if not self.calls:
            return self._turn(kind)
        calls = self._calls.get(kind)
        if calls is None:
            calls = self._calls.setdefault(kind, Calls(self.slot, self.share))
        return calls

    def share(self) -> int:
        """This host's calls at once: its share of calls among the servers sharing the
        database (counted every SERVERS_TTL_S), at least one."""
        asked, share = self._share
        now = self.clock()
        if now - asked >= SERVERS_TTL_S:
            share = max(1, self.calls // max(1, self.servers()))
            self._share = (now, share)
        return share

    def slot(self, index: int) -> Turn:
        """The host's slot index for calls of any kind (the first is the shared turn)."""
        return self._turn("call" if index == 0 else f"call.{index}")

    def _turn(self, name: str) -> Turn:
        assert self.directory is not None
        turn = self._turns.get(name)
        if turn is None:
            turn = self._turns.setdefault(
                name, Turn(self.directory / f"{name}.turn", self.wait_s)
            )
        return turn


NO_TURNS = Turns(None)


def server_id() -> str:
    """This worker's server among those sharing the database, as its node notes name it:
    the host and its master's pid (the workers of one master share its turns)."""
    return f"{socket.gethostname()}:{os.getppid()}"


def for_this_worker(
    mode: str = "auto", calls: int = 2, servers: Callable[[], int] = lambda: 1
) -> Turns:
    """The turns of this worker's host, in the directory its master chose (none without
    one). mode (QUEEN_FUSION_TURNS): auto, slots for calls of any kind, the host's share
    of calls (QUEEN_DB_CALLS) among the servers() sharing the database; kind, a turn a
    kind; host, one turn for every kind; off, no turns."""
    directory = os.environ.get(CLAIMS_ENV)
    if not directory or mode == "off":
        return NO_TURNS
    if mode == "auto":
        return Turns(Path(directory), calls=max(1, calls), servers=servers)
    return Turns(Path(directory), shared=mode == "host")
