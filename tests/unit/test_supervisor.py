"""The supervisor restarts dead children with backoff and gives up on a crash loop."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import pytest

from queen.server import status, supervisor
from queen.server.supervisor import Supervisor, describe_exit


class FakeProc:
    """Enough of Popen for the supervisor: poll, returncode, pid, signals."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.returncode = -sig

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def spawned() -> list[FakeProc]:
    return []


def make(spawned: list[FakeProc], clock: Clock) -> Supervisor:
    def spawn(argv: Sequence[str], env: Mapping[str, str]) -> FakeProc:
        proc = FakeProc(100 + len(spawned))
        spawned.append(proc)
        return proc

    sup = Supervisor([("maintenance", ["m"]), ("gunicorn", ["g"])], {}, spawn=spawn, clock=clock)  # type: ignore[arg-type]
    sup.start()
    return sup


def test_a_dead_child_is_restarted_after_a_backoff_and_the_reason_logged(
    spawned: list[FakeProc], caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    sup = make(spawned, clock)
    maintenance, gunicorn = spawned
    maintenance.returncode = -9
    with caplog.at_level(logging.INFO, "queen"):
        sup.step()
    assert "maintenance (pid 100) ended after 0.0s: killed by SIGKILL; restarting in 0.5s" in (
        caplog.text
    )
    assert len(spawned) == 2  # not yet: the backoff runs
    clock.now += supervisor.MIN_BACKOFF
    sup.step()
    assert len(spawned) == 3 and spawned[2].returncode is None
    assert gunicorn.returncode is None and not sup.failed


def test_backoff_doubles_with_recent_failures_then_the_supervisor_gives_up(
    spawned: list[FakeProc],
) -> None:
    clock = Clock()
    sup = make(spawned, clock)
    delays = []
    for _ in range(supervisor.MAX_FAILURES - 1):
        spawned[-2 if len(spawned) == 2 else -1].returncode = 1
        sup.step()
        restart_at = sup.children[0].restart_at
        assert restart_at is not None
        delays.append(restart_at - clock.now)
        clock.now = restart_at
        sup.step()
    assert delays == [0.5, 1.0, 2.0, 4.0]
    spawned[-1].returncode = 1
    sup.step()
    assert sup.failed and "maintenance exited 5 times within 60s" in sup.failed
    sup.terminate()
    assert spawned[1].signals  # gunicorn was stopped too


def test_failures_older_than_the_window_are_forgotten(spawned: list[FakeProc]) -> None:
    clock = Clock()
    sup = make(spawned, clock)
    for _ in range(supervisor.MAX_FAILURES + 2):
        spawned[-1].returncode = 1  # the gunicorn child
        sup.step()
        clock.now += supervisor.FAILURE_WINDOW_S  # each failure alone in its window
        sup.step()
    assert not sup.failed


def test_stop_terminates_every_child_and_returns_0(spawned: list[FakeProc]) -> None:
    clock = Clock()
    sup = make(spawned, clock)
    sup.stop()
    assert sup.run(sleep=lambda s: None) == 0  # run starts a fresh set, then stops
    assert all(p.signals == [15] for p in spawned[2:])


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-15) == "killed by SIGTERM"


def test_a_crash_looping_child_that_is_not_essential_is_restarted_with_capped_backoff(
    spawned: list[FakeProc], tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    state = tmp_path / "children.json"
    sup = Supervisor(
        [("maintenance", ["m"]), ("gunicorn", ["g"])], {},
        spawn=lambda argv, env: spawned.append(FakeProc(100 + len(spawned))) or spawned[-1],  # type: ignore[arg-type, func-returns-value]
        clock=clock, essential={"gunicorn"}, state_path=str(state),
    )
    sup.start()
    assert status.read_state(state)["maintenance"]["status"] == "running"
    delays = []
    with caplog.at_level(logging.INFO, "queen"):
        for _ in range(supervisor.MAX_FAILURES + 3):
            spawned[0 if len(spawned) == 2 else -1].returncode = 1
            sup.step()
            restart_at = sup.children[0].restart_at
            assert restart_at is not None and not sup.failed
            delays.append(restart_at - clock.now)
            clock.now = restart_at
            sup.step()
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    assert "maintenance is crash-looping" in caplog.text
    looping = status.read_state(state)["maintenance"]
    assert looping["status"] == "crash-looping" and looping["restarts"] == 8
    assert looping["lastExit"] == "exit code 1" and looping["pid"] == spawned[-1].pid
    clock.now += supervisor.RECOVERED_AFTER_S
    sup.step()
    assert status.read_state(state)["maintenance"]["status"] == "running"
    assert spawned[1].returncode is None  # gunicorn ran throughout


def test_the_essential_child_still_stops_the_server_when_it_crash_loops(
    spawned: list[FakeProc],
) -> None:
    clock = Clock()
    sup = Supervisor(
        [("maintenance", ["m"]), ("gunicorn", ["g"])], {},
        spawn=lambda argv, env: spawned.append(FakeProc(100 + len(spawned))) or spawned[-1],  # type: ignore[arg-type, func-returns-value]
        clock=clock, essential={"gunicorn"},
    )
    sup.start()
    for _ in range(supervisor.MAX_FAILURES):
        spawned[1 if len(spawned) == 2 else -1].returncode = 1
        sup.step()
        if sup.failed:
            break
        clock.now = sup.children[1].restart_at or clock.now
        sup.step()
    assert sup.failed and "gunicorn exited 5 times within 60s" in sup.failed
