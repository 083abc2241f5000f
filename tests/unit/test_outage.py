"""The outage breaker: fail fast while the database is known down, one probe a second."""

from __future__ import annotations

from queen.store import db
from queen.store.db import Outage


class Clock:
    now = 50.0

    def __call__(self) -> float:
        return self.now


def test_no_outage_admits_with_the_full_wait() -> None:
    assert Outage(Clock()).admit(5.0) == 5.0


def test_a_known_outage_refuses_all_but_one_probe_a_second() -> None:
    clock = Clock()
    outage = Outage(clock)
    outage.failed()
    assert outage.admit(5.0) is None
    clock.now += db.PROBE_EVERY_S
    assert outage.admit(5.0) == db.PROBE_WAIT_S  # the probe
    assert outage.admit(5.0) is None  # the others, until the next second
    outage.recovered()
    assert outage.admit(5.0) == 5.0


def test_repeated_failures_keep_the_outage_start() -> None:
    clock = Clock()
    outage = Outage(clock)
    outage.failed()
    clock.now += 3
    outage.failed()
    assert outage.since == 50.0
