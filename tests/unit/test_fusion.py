"""The fuser: who runs a call, which requests share it, and who hears its errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from queen.fusion import Fuser, split

WAIT_S = 20.0  # generous: only a broken fuser takes this long


class Gate:
    """A run function whose first call waits until released; records every call."""

    def __init__(self, answer: Callable[[Any], Any] = lambda r: r * 10) -> None:
        self.calls: list[tuple[list[Any], str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.answer = answer

    def __call__(self, requests: list[Any]) -> Sequence[Any]:
        self.calls.append((list(requests), threading.current_thread().name))
        if len(self.calls) == 1:
            self.entered.set()
            assert self.release.wait(WAIT_S)
        return [self.answer(r) for r in requests]


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def submit_in_threads(fuser: Fuser[Any, Any], requests: list[Any]) -> tuple[dict[Any, Any], list[threading.Thread]]:
    """Submit each request from a thread of its own, in order (each queued before the next)."""
    outcomes: dict[Any, Any] = {}

    def one(request: Any) -> None:
        try:
            outcomes[request] = fuser.submit(request)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcomes[request] = exc

    threads = []
    for request in requests:
        queued = len(fuser._queued)
        t = threading.Thread(target=one, args=(request,), name=f"client-{request}")
        t.start()
        threads.append(t)
        wait_for(lambda q=queued: len(fuser._queued) == q + 1)  # noqa: B023
    return outcomes, threads


def test_a_lone_request_runs_at_once_in_its_own_thread_alone() -> None:
    sizes: list[int] = []
    fuser: Fuser[int, int] = Fuser(
        "push", lambda rs: [r + 1 for r in rs], max_calls=2, limit=100,
        observe=lambda kind, n: sizes.append(n),
    )
    ran_in: list[str] = []
    fuser.run = lambda rs: (ran_in.append(threading.current_thread().name), [r + 1 for r in rs])[1]
    assert fuser.submit(41) == 42
    assert ran_in == [threading.current_thread().name]  # the caller's own call, no hand-off
    assert sizes == [1]
    assert not fuser._queued and fuser._running == 0


def test_requests_waiting_while_the_calls_are_busy_share_the_next_call_in_order() -> None:
    gate = Gate()
    fuser: Fuser[int, int] = Fuser("pop", gate, max_calls=1, limit=100)
    first = threading.Thread(target=fuser.submit, args=(0,), name="leader")
    first.start()
    assert gate.entered.wait(WAIT_S)
    outcomes, threads = submit_in_threads(fuser, [1, 2, 3, 4, 5])
    gate.release.set()
    for t in [first, *threads]:
        t.join(WAIT_S)
    assert [c[0] for c in gate.calls] == [[0], [1, 2, 3, 4, 5]]
    assert gate.calls[1][1] == "client-1"  # the oldest waiting request led the call
    assert outcomes == {n: n * 10 for n in range(1, 6)}  # each its own result
    assert not fuser._queued and fuser._running == 0


def test_a_call_takes_queued_requests_up_to_the_limit_and_the_rest_go_next() -> None:
    gate = Gate()
    fuser: Fuser[int, int] = Fuser("push", gate, max_calls=1, limit=10, size=lambda r: r)
    first = threading.Thread(target=fuser.submit, args=(20,))  # over the limit: goes alone
    first.start()
    assert gate.entered.wait(WAIT_S)
    outcomes, threads = submit_in_threads(fuser, [4, 5, 6, 3])
    gate.release.set()
    for t in [first, *threads]:
        t.join(WAIT_S)
    assert [c[0] for c in gate.calls] == [[20], [4, 5], [6, 3]]
    assert outcomes == {4: 40, 5: 50, 6: 60, 3: 30}


def test_an_error_result_fails_its_own_request_only() -> None:
    gate = Gate(lambda r: ValueError(f"bad {r}") if r == 2 else r)
    fuser: Fuser[int, int] = Fuser("ack", gate, max_calls=1, limit=100)
    first = threading.Thread(target=fuser.submit, args=(0,))
    first.start()
    assert gate.entered.wait(WAIT_S)
    outcomes, threads = submit_in_threads(fuser, [1, 2, 3])
    gate.release.set()
    for t in [first, *threads]:
        t.join(WAIT_S)
    assert outcomes[1] == 1 and outcomes[3] == 3
    assert isinstance(outcomes[2], ValueError) and str(outcomes[2]) == "bad 2"


def test_a_failed_call_fails_its_requests_only_and_the_next_call_works() -> None:
    calls: list[list[int]] = []
    entered, release = threading.Event(), threading.Event()

    def run(requests: list[int]) -> list[int]:
        calls.append(list(requests))
        if len(calls) == 1:
            entered.set()
            assert release.wait(WAIT_S)
        if len(calls) == 2:
            raise ConnectionError("database gone")
        return list(requests)

    fuser: Fuser[int, int] = Fuser("push", run, max_calls=1, limit=2)
    first = threading.Thread(target=fuser.submit, args=(0,))
    first.start()
    assert entered.wait(WAIT_S)
    outcomes, threads = submit_in_threads(fuser, [1, 2, 3])
    release.set()
    for t in [first, *threads]:
        t.join(WAIT_S)
    assert calls == [[0], [1, 2], [3]]
    assert isinstance(outcomes[1], ConnectionError) and isinstance(outcomes[2], ConnectionError)
    assert outcomes[3] == 3
    assert fuser.submit(7) == 7 and fuser._running == 0


def test_several_calls_may_run_at_once_up_to_max_calls() -> None:
    inside = threading.Semaphore(0)
    release = threading.Event()

    def run(requests: list[int]) -> list[int]:
        inside.release()
        assert release.wait(WAIT_S)
        return list(requests)

    fuser: Fuser[int, int] = Fuser("pop", run, max_calls=2, limit=100)
    a = threading.Thread(target=fuser.submit, args=(1,))
    b = threading.Thread(target=fuser.submit, args=(2,))
    a.start()
    b.start()
    assert inside.acquire(timeout=WAIT_S) and inside.acquire(timeout=WAIT_S)  # both in flight
    outcomes, threads = submit_in_threads(fuser, [3])  # the third waits for a slot
    assert fuser._running == 2
    release.set()
    for t in [a, b, *threads]:
        t.join(WAIT_S)
    assert outcomes == {3: 3} and fuser._running == 0


def test_split_cuts_rows_by_request_and_refuses_a_short_answer() -> None:
    assert split([1, 2, 3, 4], [1, 3]) == [[1], [2, 3, 4]]
    with pytest.raises(RuntimeError):
        split([1, 2], [1, 2])


KILLED = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import json, threading
    import gevent
    from queen.fusion import Fuser

    release = threading.Event()
    calls = []

    def run(requests):
        calls.append(list(requests))
        if len(calls) == 1:
            release.wait()
        return list(requests)

    fuser = Fuser("pop", run, max_calls=1, limit=100)
    leader = gevent.spawn(fuser.submit, 0)
    gevent.sleep(0.01)
    queued = gevent.spawn(fuser.submit, 1)  # killed while queued behind the leader's call
    gevent.sleep(0.01)
    queued.kill()
    release.set()
    leader.join()
    after = gevent.spawn(fuser.submit, 3)
    after.join(timeout=5)
    print(json.dumps({"after": after.value, "calls": calls, "running": fuser._running,
                      "queued": len(fuser._queued)}))
    """
)


def test_a_request_killed_while_queued_leaves_no_turn_behind() -> None:
    done = subprocess.run(
        [sys.executable, "-c", KILLED], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["after"] == 3  # a later request still runs: no slot was lost
    assert found["calls"] == [[0], [3]]  # the killed request was never run
    assert found["running"] == 0 and found["queued"] == 0
