"""The file of a worker's claims in flight, as its master reads it after a death."""

from __future__ import annotations

import uuid
from pathlib import Path

from queen.server.claims import NOWHERE, InFlight, unanswered


def test_what_was_begun_and_not_ended_is_unanswered(tmp_path: Path) -> None:
    path = tmp_path / "1.claims"
    record = InFlight(path)
    a, b, c = (uuid.uuid4() for _ in range(3))
    record.begin(a)
    record.begin(b)
    record.end([a])
    record.begin(c)
    assert unanswered(path) == [b, c]
    record.end([b, c, uuid.uuid4()])  # (an unknown lease is ignored)
    assert unanswered(path) == []
    assert path.stat().st_size == 0  # nothing in flight: the file starts over
    record.close()


def test_a_claim_is_answered_by_the_lease_id_made_of_its_own(tmp_path: Path) -> None:
    """The lease's id keeps the last 8 bytes of the id its claim was made under, its
    first ones its partition's (queen.lease_in)."""
    path = tmp_path / "3.claims"
    record = InFlight(path)
    chosen, other = uuid.uuid4(), uuid.uuid4()
    record.begin(chosen)
    record.begin(other)
    placed = uuid.UUID(bytes=uuid.uuid4().bytes[:8] + chosen.bytes[8:])
    record.end([placed])
    assert unanswered(path) == [other]
    assert record.in_flight() == 1
    path.write_text(f"+{chosen.hex}\n-{placed.hex}\n")  # (as the master reads it)
    assert unanswered(path) == []
    record.close()


def test_a_line_cut_short_by_the_death_is_skipped(tmp_path: Path) -> None:
    lease = uuid.uuid4()
    path = tmp_path / "2.claims"
    path.write_text(f"+{lease.hex}\n+{uuid.uuid4().hex[:10]}")
    assert unanswered(path) == [lease]
    assert unanswered(tmp_path / "missing.claims") == []


def test_a_process_without_a_master_records_nothing() -> None:
    NOWHERE.begin(uuid.uuid4())
    assert NOWHERE.in_flight() == 0
