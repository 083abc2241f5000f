"""The maintenance scheduler and leadership loop, with a fake session and a fake clock."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest

from queen.config import Settings
from queen.errors import Unavailable
from queen.store.maintenance import (
    DueScan,
    LeaseExpiry,
    TimedQueue,
    VacuumCandidate,
)
from queen.store.migrate import EarlierDatabase
from workers import maintenance as worker
from workers.maintenance import DUE_MARGIN, MORE_DELAY, Maintenance, build_parser


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeSession:
    """Answers like MaintenanceSession; records calls; time passes only in wait()."""

    def __init__(self, clock: Clock, lead_after: int = 0) -> None:
        self.clock = clock
        self.calls: list[str] = []
        self.connected = False
        self.lead_after = lead_after
        self.results: dict[str, Any] = {}
        self.on_wait: Any = None

    def _answer(self, name: str, default: Any) -> Any:
        self.calls.append(name)
        value = self.results.get(name, default)
        if isinstance(value, BaseException):
            raise value
        return value

    def connect(self) -> None:
        self.calls.append("connect")
        self.connected = True

    def close(self) -> None:
        self.calls.append("close")
        self.connected = False

    def check_schema(self) -> None:
        self._answer("check_schema", None)

    def try_lead(self) -> bool:
        self.calls.append("try_lead")
        self.lead_after -= 1
        return self.lead_after < 0

    def leader(self) -> str | None:
        return "other"

    def listen(self, on: bool = True) -> None:
        self.calls.append("listen" if on else "unlisten")

    def wait(self, timeout_s: float) -> list[str]:
        self.calls.append("wait")
        self.clock.now += timeout_s
        return self.on_wait(timeout_s) if self.on_wait else []

    def expire_leases(self, limit: int) -> LeaseExpiry:
        return self._answer("expire_leases", LeaseExpiry(0, 0, None))

    def wake_due(self, since: dt.datetime | None) -> DueScan:
        return self._answer("wake_due", DueScan(0, None, dt.datetime.now(dt.UTC)))

    def timed_queues(self) -> dict[str, TimedQueue]:
        return self._answer("timed_queues", {})

    def expire_ttl(self, limit: int) -> int:
        return self._answer("expire_ttl", 0)

    def retention(self, limit: int) -> int:
        return self._answer("retention", 0)

    def cleanup_partitions(self, idle_s: int, limit: int) -> int:
        return self._answer("cleanup_partitions", 0)

    def refresh_counts(self, partitions: int, step: int, settle_s: float, lag: int) -> int:
        return self._answer("refresh_counts", 0)

    def prune_metrics(self, days: int, limit: int) -> int:
        return self._answer("prune_metrics", 0)

    def analyze(self, min_changes: int = 1000) -> list[str]:
        return self._answer("analyze", [])

    def vacuum_candidates(
        self, min_dead: int, dead_ratio: float, quiet_s: float
    ) -> list[VacuumCandidate]:
        return self._answer("vacuum_candidates", [])

    def vacuum(self, name: str) -> None:
        self.calls.append(f"vacuum {name}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def session(clock: Clock) -> FakeSession:
    return FakeSession(clock)


def make(session: FakeSession, clock: Clock, **settings: Any) -> Maintenance:
    m = Maintenance(Settings(**settings), session=session, clock=clock)  # type: ignore[arg-type]
    session.connected = True
    for task in m.tasks:
        task.next_at = clock.now + 1000  # nothing due unless a test says so
    return m


def task(m: Maintenance, name: str) -> worker.Task:
    return next(t for t in m.tasks if t.name == name)


def test_flags_override_the_environment() -> None:
    args = build_parser().parse_args(["--maintenance-interval", "0.2", "--leader-poll", "0.5"])
    settings = Settings.from_env({"QUEEN_LEADER_POLL": "3"}, **vars(args))
    assert (settings.maintenance_interval_s, settings.leader_poll_s) == (0.2, 0.5)
    assert settings.retention_interval_s == Settings().retention_interval_s


def test_every_flag_names_its_variable() -> None:
    text = build_parser().format_help()
    for name in worker.FLAGS:
        field = Settings.__dataclass_fields__[name]
        assert field.metadata["env"] in text


def test_punctual_tasks_run_first_then_the_longest_waiting(session, clock) -> None:
    m = make(session, clock)
    task(m, "counts").next_at = clock.now - 5
    task(m, "ttl").next_at = clock.now - 3
    task(m, "due").next_at = clock.now - 1
    assert m._next_task(clock.now).name == "due"
    task(m, "due").next_at = clock.now + 1
    assert m._next_task(clock.now).name == "counts"
    assert m._next_task(clock.now - 10) is None


def test_a_full_batch_runs_again_soon(session, clock) -> None:
    m = make(session, clock, maintenance_batch=10)
    session.results["expire_ttl"] = 10
    m._run_task(task(m, "ttl"))
    assert task(m, "ttl").next_at == pytest.approx(clock.now + MORE_DELAY)
    session.results["expire_ttl"] = 3
    m._run_task(task(m, "ttl"))
    assert task(m, "ttl").next_at == pytest.approx(clock.now + m.settings.maintenance_interval_s)
    assert m.totals["ttl expired"] == 13


def test_leases_are_looked_at_when_the_next_one_expires(session, clock) -> None:
    m = make(session, clock, maintenance_interval_s=5.0)
    session.results["expire_leases"] = LeaseExpiry(1, 3, 0.7)
    m._run_task(task(m, "leases"))
    assert task(m, "leases").next_at == pytest.approx(clock.now + 0.7 + DUE_MARGIN)
    session.results["expire_leases"] = LeaseExpiry(0, 0, 60.0)
    m._run_task(task(m, "leases"))
    assert task(m, "leases").next_at == pytest.approx(clock.now + 5.0)  # never later than that


def test_due_scan_sleeps_until_the_next_due_partition(session, clock) -> None:
    m = make(session, clock)
    first = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    session.results["wake_due"] = DueScan(2, 0.25, first)
    m._run_task(task(m, "due"))
    assert task(m, "due").next_at == pytest.approx(clock.now + 0.25 + DUE_MARGIN)
    assert m._since_scan == first
    assert m.totals["partitions woken"] == 2


def test_a_push_into_a_timed_queue_schedules_a_scan(session, clock) -> None:
    m = make(session, clock)
    m._timed = {"d": TimedQueue("d", delay_s=3, window_s=0), "w": TimedQueue("w", 5, 2)}
    due = task(m, "due")
    m._on_pushes(["plain/Default//"])
    assert due.next_at == clock.now + 1000
    m._on_pushes(["w/p/ns/"])
    assert due.next_at == pytest.approx(clock.now + 2 + DUE_MARGIN)
    m._on_pushes(["d/Default//"])
    assert due.next_at == pytest.approx(clock.now + 2 + DUE_MARGIN)  # the earliest wins


def test_a_failing_task_backs_off_while_the_session_lives(session, clock) -> None:
    m = make(session, clock, maintenance_interval_s=1.0)
    session.results["refresh_counts"] = RuntimeError("bug")
    m._run_task(task(m, "counts"))
    m._run_task(task(m, "counts"))
    assert task(m, "counts").failures == 2
    assert task(m, "counts").next_at == pytest.approx(clock.now + 4.0)  # 1 s, doubled twice
    session.results["refresh_counts"] = 0
    m._run_task(task(m, "counts"))
    assert task(m, "counts").failures == 0


def test_a_broken_session_ends_the_leadership(session, clock) -> None:
    m = make(session, clock)
    session.results["refresh_counts"] = Unavailable("database unavailable")
    session.connected = False
    with pytest.raises(Unavailable):
        m._run_task(task(m, "counts"))


def test_stands_by_then_leads_then_stops(clock) -> None:
    session = FakeSession(clock, lead_after=2)
    session.results["timed_queues"] = {"d": TimedQueue("d", 1, 0)}
    m = Maintenance(Settings(leader_poll_s=0.5), session=session, clock=clock)  # type: ignore[arg-type]
    leading_waits = 0

    def on_wait(timeout: float) -> list[str]:
        nonlocal leading_waits
        if m.leading:
            leading_waits += 1
            if leading_waits == 3:
                m.stop()
        return []

    session.on_wait = on_wait
    assert m.run() == 0
    assert session.calls[:3] == ["connect", "check_schema", "try_lead"]
    assert session.calls.count("try_lead") == 3
    first_lead = session.calls.index("listen")
    assert {"expire_leases", "wake_due", "refresh_counts", "expire_ttl"} <= set(
        session.calls[first_lead:]
    )
    assert session.calls[-1] == "close"


def test_a_lost_database_steps_down_and_reconnects(clock, monkeypatch) -> None:
    session = FakeSession(clock)
    session.results["timed_queues"] = {"d": TimedQueue("d", 1, 0)}
    m = Maintenance(Settings(), session=session, clock=clock)  # type: ignore[arg-type]
    monkeypatch.setattr(worker.time, "sleep", lambda s: setattr(clock, "now", clock.now + s))
    connects = 0

    def on_wait(timeout: float) -> list[str]:
        nonlocal connects
        if session.calls.count("connect") == 1:
            session.connected = False
            raise Unavailable("database unavailable")
        m.stop()
        return []

    session.on_wait = on_wait
    assert m.run() == 0
    assert session.calls.count("connect") == 2
    assert session.calls.count("listen") == 2  # led, stepped down, led again
    assert not m.leading or m.stopping


def test_a_database_of_an_earlier_build_stops_maintenance_before_any_work(clock) -> None:
    session = FakeSession(clock)
    session.results["check_schema"] = EarlierDatabase("made by an earlier build")
    m = Maintenance(Settings(), session=session, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(EarlierDatabase):
        m.run()
    assert session.calls == ["connect", "check_schema", "close"]


def test_listens_to_pushes_only_while_timed_queues_exist(session, clock) -> None:
    m = make(session, clock)
    m._run_task(task(m, "timed"))
    assert "listen" not in session.calls
    session.results["timed_queues"] = {"d": TimedQueue("d", 1, 0)}
    m._run_task(task(m, "timed"))
    m._run_task(task(m, "timed"))
    assert session.calls.count("listen") == 1
    session.results["timed_queues"] = {}
    m._run_task(task(m, "timed"))
    assert session.calls[-1] == "unlisten"
    assert m._timed == {}


def test_due_scans_run_twice_within_the_shortest_delay(session, clock) -> None:
    m = make(session, clock, maintenance_interval_s=5.0)
    session.results["timed_queues"] = {"d": TimedQueue("d", 3, 0), "w": TimedQueue("w", 0, 2)}
    m._run_task(task(m, "timed"))
    assert task(m, "due").every == 1.0
    assert task(m, "due").next_at == pytest.approx(clock.now + 1.0)
    session.results["timed_queues"] = {}
    m._run_task(task(m, "timed"))
    assert task(m, "due").every == 5.0


def test_small_tables_are_vacuumed_inline_and_a_big_one_apart(session, clock, monkeypatch) -> None:
    apart: list[str] = []
    started = threading.Event()

    def fake_vacuum_apart(dsn: str, name: str, application_name: str) -> None:
        apart.append(name)
        started.set()

    monkeypatch.setattr(worker, "vacuum_apart", fake_vacuum_apart)
    session.dsn = "dbname=x"
    big = worker.VACUUM_INLINE_BYTES + 1
    m = make(session, clock)
    # With autovacuum on, the big table is left to it.
    session.results["vacuum_candidates"] = [
        VacuumCandidate("queen.partitions", 8192, autovacuum=True),
        VacuumCandidate("queen.messages", big, autovacuum=True),
    ]
    m._run_task(task(m, "vacuum"))
    assert "vacuum queen.partitions" in session.calls
    assert apart == []
    # With autovacuum off, Queen vacuums it, apart from the maintenance session.
    session.results["vacuum_candidates"] = [VacuumCandidate("queen.messages", big, False)]
    m._run_task(task(m, "vacuum"))
    assert "vacuum queen.messages" not in session.calls
    assert started.wait(5) and apart == ["queen.messages"]
    assert task(m, "vacuum").failures == 0


def test_every_task_runs_against_the_session_interface(session, clock) -> None:
    # A task calling a method the session lacks would only log and back off forever.
    m = make(session, clock)
    for t in m.tasks:
        m._run_task(t)
        assert t.failures == 0, t.name
