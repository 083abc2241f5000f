"""Turns: a host's workers take turns at each kind of fused call (queen.server.turns).

Two Turn objects on one file stand for two workers: their flocks exclude each other as two
processes' would.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from queen.config import SettingError, Settings
from queen.fusion import Fuser
from queen.server.claims import CLAIMS_ENV
from queen.server.turns import NO_TURNS, SERVERS_TTL_S, Calls, Turn, Turns, for_this_worker
from tests.conftest import ROOT

WAIT_S = 30.0  # long enough never to give up on a holder that is not stuck


def test_a_turn_excludes_the_other_workers_until_given_back(tmp_path: Path) -> None:
    first, second = Turn(tmp_path / "pop.turn", WAIT_S), Turn(tmp_path / "pop.turn", WAIT_S)
    first.take()
    assert first.held
    got = threading.Event()

    def take_second() -> None:
        with second:
            assert second.held
            got.set()

    waiter = threading.Thread(target=take_second)
    waiter.start()
    assert not got.wait(0.3)
    first.give()
    assert got.wait(10)
    waiter.join(10)
    with first:  # and back again
        assert first.held


def _hold(path: str, ready: multiprocessing.synchronize.Event) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    time.sleep(600)


def test_a_dead_holders_turn_is_free_at_once(tmp_path: Path) -> None:
    path = tmp_path / "push.turn"
    ready = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(target=_hold, args=(str(path), ready))
    holder.start()
    try:
        assert ready.wait(10)
        turn = Turn(path, WAIT_S)
        done = threading.Event()

        def take() -> None:
            with turn:
                assert turn.held
                done.set()

        threading.Thread(target=take, daemon=True).start()
        assert not done.wait(0.3)
        holder.kill()
        assert done.wait(10)  # long before WAIT_S: the kernel gave the turn back
    finally:
        holder.kill()
        holder.join(10)


def test_a_stuck_holder_costs_fusion_not_availability(tmp_path: Path) -> None:
    stuck, turn = Turn(tmp_path / "ack.turn"), Turn(tmp_path / "ack.turn", wait_s=0.2)
    stuck.take()
    started = time.monotonic()
    with turn:
        assert not turn.held  # went without it
    assert time.monotonic() - started >= 0.2
    started = time.monotonic()
    with turn:  # while that wait goes on, the next calls go without at once
        assert not turn.held
    assert time.monotonic() - started < 0.2
    stuck.give()  # the abandoned wait gets it, gives it back and ends
    deadline = time.monotonic() + 10
    while True:
        with turn:
            if turn.held:
                break
        assert time.monotonic() < deadline, "the turn never came back"
        time.sleep(0.01)
    with stuck:  # nobody kept it
        assert stuck.held


def test_no_directory_no_turns(tmp_path: Path) -> None:
    assert NO_TURNS.of("pop") is None
    turns = Turns(tmp_path)
    assert turns.of("pop") is turns.of("pop")
    assert turns.of("pop") is not turns.of("ack")


def test_the_setting_chooses_slots_a_turn_a_kind_one_for_all_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CLAIMS_ENV, str(tmp_path))
    kinds = for_this_worker("kind")
    assert kinds.of("pop") is not kinds.of("push")
    host = for_this_worker("host")
    assert host.of("pop") is host.of("push") is host.of("ack")
    assert for_this_worker("off") is NO_TURNS
    auto = for_this_worker("auto", 4, lambda: 2)
    pop, push = auto.of("pop"), auto.of("push")
    assert isinstance(pop, Calls) and pop is auto.of("pop") and pop is not push
    assert auto.share() == 2  # four calls at once between two servers
    assert for_this_worker("auto", 1, lambda: 3).share() == 1  # at least one a server
    assert Settings.from_env({"QUEEN_FUSION_TURNS": "host"}).fusion_turns == "host"
    assert Settings.from_env({}).fusion_turns == "auto"
    assert Settings.from_env({}).db_calls == 2
    assert Settings.from_env({"QUEEN_DB_CALLS": "8"}).db_calls == 8
    with pytest.raises(SettingError):
        Settings.from_env({"QUEEN_FUSION_TURNS": "always"})
    with pytest.raises(SettingError):
        Settings.from_env({"QUEEN_DB_CALLS": "0"})
    monkeypatch.delenv(CLAIMS_ENV)
    assert for_this_worker("host") is NO_TURNS


def _took(turn: Calls) -> bool:
    """Take turn (waiting up to its wait_s, then going without); whether it was held."""
    with turn:
        return turn.held


def _held_again(turn: Calls) -> None:
    """A wait given up on ends once its slot is free; the slot is taken again after it."""
    deadline = time.monotonic() + 10
    while not _took(turn):
        assert time.monotonic() < deadline, "the slot never came back"
        time.sleep(0.01)


def test_auto_gives_the_database_its_calls_split_among_the_servers(tmp_path: Path) -> None:
    """Two calls at once, of any kind: one is taken at once while another worker's call
    runs, none while two do; once a second server shares the database, one a server."""
    servers = [1]
    clock = [100.0]
    mine = Turns(tmp_path, wait_s=0.2, calls=2, servers=lambda: servers[0],
                 clock=lambda: clock[0])
    pop, push = mine.of("pop"), mine.of("push")
    assert isinstance(pop, Calls) and isinstance(push, Calls)
    first, second = Turn(tmp_path / "call.turn"), Turn(tmp_path / "call.1.turn")
    with first:  # another worker's call of any kind
        assert _took(pop)  # the other slot
        with pop:  # and this worker's push beside its pop: the two slots held
            assert pop.held
            started = time.monotonic()
            with push:
                assert not push.held  # none free: waited wait_s, then went without
            assert time.monotonic() - started >= 0.2
    _held_again(push)
    got = threading.Event()

    def take() -> None:
        with Turns(tmp_path, wait_s=WAIT_S, calls=2).of("ack") as waited:
            assert waited.held
            got.set()

    with first, second:  # two other calls: a third waits
        waiter = threading.Thread(target=take)
        waiter.start()
        assert not got.wait(0.3)
    assert got.wait(10)
    waiter.join(10)
    servers[0] = 2  # a second server's notes arrived
    with first:
        assert _took(pop)  # counted at most every SERVERS_TTL_S: still two
        clock[0] += SERVERS_TTL_S
        assert mine.share() == 1
        started = time.monotonic()
        with pop:
            assert not pop.held  # its one slot is taken: it waited
        assert time.monotonic() - started >= 0.2
    _held_again(pop)
    servers[0] = 1
    clock[0] += SERVERS_TTL_S
    with first:
        assert _took(pop)  # alone again: two


def test_four_workers_never_make_more_calls_at_once_than_the_slots(tmp_path: Path) -> None:
    running = 0
    peak = 0
    lock = threading.Lock()

    def calls(turns: Turns, kind: str) -> None:
        nonlocal running, peak
        for _ in range(30):
            with turns.of(kind) as turn:
                assert turn is not None and turn.held
                with lock:
                    running += 1
                    peak = max(peak, running)
                time.sleep(0.001)
                with lock:
                    running -= 1

    workers = [Turns(tmp_path, wait_s=WAIT_S, calls=2) for _ in range(4)]
    threads = [threading.Thread(target=calls, args=(w, kind))
               for w in workers for kind in ("push", "pop", "ack")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert 1 <= peak <= 2


def test_two_workers_fusers_never_call_at_once_and_requests_wait_for_the_next_call(
    tmp_path: Path,
) -> None:
    """While one worker's call runs, the other's requests queue; its next call takes them."""
    running = 0
    overlaps = 0
    calls: list[tuple[str, list[int]]] = []
    lock = threading.Lock()
    release_first = threading.Event()

    def runner(name: str):
        def run(requests: list[int]) -> list[int]:
            nonlocal running, overlaps
            with lock:
                running += 1
                overlaps += running > 1
                calls.append((name, list(requests)))
            if requests == [0]:
                release_first.wait(10)  # worker a's first call holds the turn
            time.sleep(0.01)
            with lock:
                running -= 1
            return [r * 10 for r in requests]

        return run

    a = Fuser("pop", runner("a"), max_calls=1, limit=100,
              turn=Turn(tmp_path / "pop.turn", WAIT_S))
    b = Fuser("pop", runner("b"), max_calls=1, limit=100,
              turn=Turn(tmp_path / "pop.turn", WAIT_S))
    results: dict[int, int] = {}

    def submit(fuser: Fuser[int, int], request: int) -> None:
        results[request] = fuser.submit(request)

    first = threading.Thread(target=submit, args=(a, 0))
    first.start()
    while not calls:
        time.sleep(0.001)
    others = [threading.Thread(target=submit, args=(b, n)) for n in range(1, 6)]
    for thread in others:
        thread.start()
    time.sleep(0.3)  # b's requests all wait for a's call: b has not called
    assert [name for name, _ in calls] == ["a"]
    release_first.set()
    for thread in [first, *others]:
        thread.join(10)
    assert results == {n: n * 10 for n in range(6)}
    assert overlaps == 0
    # b's first request waited for the turn; by then the others had queued behind it.
    assert len(calls) == 2
    assert calls[1][0] == "b"
    assert sorted(calls[1][1]) == [1, 2, 3, 4, 5]


def test_a_call_gives_the_turn_back_once_the_database_has_answered(tmp_path: Path) -> None:
    """What is left of a call after answered() (reading its rows) holds no other worker up."""
    reading = threading.Event()
    read = threading.Event()

    def run_a(requests: list[int]) -> list[int]:
        a.answered()
        reading.set()
        read.wait(10)  # this worker still reads its rows
        return requests

    a: Fuser[int, int] = Fuser("pop", run_a, max_calls=1, limit=100,
                               turn=Turn(tmp_path / "pop.turn", WAIT_S))
    b: Fuser[int, int] = Fuser("pop", lambda requests: requests, max_calls=1, limit=100,
                               turn=Turn(tmp_path / "pop.turn", WAIT_S))
    got: list[int] = []
    first = threading.Thread(target=lambda: got.append(a.submit(1)))
    first.start()
    try:
        assert reading.wait(10)
        answers: list[int] = []
        second = threading.Thread(target=lambda: answers.append(b.submit(2)))
        second.start()
        second.join(10)
        assert answers == [2]
    finally:
        read.set()
        first.join(10)
    assert got == [1]  # (a turn given back twice would have failed the call)
    assert a.submit(3) == 3


GEVENT_KILL = textwrap.dedent(
    """
    from gevent import monkey
    monkey.patch_all()
    import sys, gevent
    from pathlib import Path
    from queen.fusion import Fuser
    from queen.server.turns import Turn

    path = Path(sys.argv[1])
    holder = Turn(path, 30)
    holder.take()
    fuser = Fuser("pop", lambda requests: list(requests), max_calls=1, limit=100,
                  turn=Turn(path, 30))
    ticks = 0

    def tick():
        global ticks
        while True:
            ticks += 1
            gevent.sleep(0.01)

    ticker = gevent.spawn(tick)
    waiting = gevent.spawn(fuser.submit, 1)
    gevent.sleep(0.3)
    assert not waiting.ready()
    assert ticks > 5, ticks  # the wait for the turn did not block the worker
    waiting.kill()
    holder.give()
    assert fuser.submit(2) == 2  # the killed request left no slot or turn behind
    with holder:
        assert holder.held
    print("ok")
    """
)


def test_under_gevent_a_request_killed_while_waiting_for_the_turn_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", GEVENT_KILL, str(tmp_path / "pop.turn")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
