"""Acks and transactions whose answer is lost after they applied: the client sends them
again (through a proxy that drops the first answer), and the second answer says what is
so instead of refusing them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from queen.client import Queen, RetryPolicy
from tests.conftest import Server
from tests.faults.proxy import AnswerDropper


@pytest.fixture
def dropper(db_dsn: str) -> Iterator[AnswerDropper]:
    server = Server(db_dsn).start()
    proxy = AnswerDropper(server.port)
    try:
        yield proxy
    finally:
        proxy.close()
        server.stop()


@pytest.fixture
def queen(dropper: AnswerDropper) -> Iterator[Queen]:
    policy = RetryPolicy(rounds=4, base_delay=0.05, max_delay=0.5)
    with Queen(f"http://127.0.0.1:{dropper.port}", retry=policy) as client:
        yield client


def test_an_ack_whose_answer_was_lost_is_answered_already_completed(
    queen: Queen, dropper: AnswerDropper
) -> None:
    queen.push("lost-ack", [{"n": 1}])
    (message,) = queen.pop("lost-ack")
    dropper.drop_next_answer()
    result = queen.ack(message)  # applied; the answer lost; sent again: no Conflict
    assert dropper.dropped == 1
    assert (result.status, result.reason, result.applied) == (
        "completed", "already_completed", False)
    assert queen.pop("lost-ack") == []  # completed once, not delivered again
    assert queen.ack(message).reason == "already_completed"


def test_a_batch_ack_whose_answer_was_lost_is_answered_per_item(
    queen: Queen, dropper: AnswerDropper
) -> None:
    queen.push("lost-batch", [{"n": 1}, {"n": 2}, {"n": 3}])
    messages = queen.pop("lost-batch", batch=3)
    dropper.drop_next_answer()
    results = queen.ack_many(messages)
    assert dropper.dropped == 1
    assert [(r.status, r.reason) for r in results] == [("completed", "already_completed")] * 3
    assert queen.pop("lost-batch") == []


def test_a_failed_ack_whose_answer_was_lost_is_answered_already_failed(
    queen: Queen, dropper: AnswerDropper
) -> None:
    queen.configure("lost-failed", retry_limit=3)
    queen.push("lost-failed", [{"n": 1}])
    (message,) = queen.pop("lost-failed")
    dropper.drop_next_answer()
    result = queen.ack(message, error="boom")
    assert dropper.dropped == 1
    assert (result.status, result.reason, result.retry_count) == (
        "retry_scheduled", "already_failed", 1)
    (again,) = queen.pop("lost-failed")  # one failure counted, not two
    assert again.retry_count == 1


def test_a_transaction_whose_answer_was_lost_is_answered_already_applied(
    queen: Queen, dropper: AnswerDropper
) -> None:
    queen.push("stage-in", [{"n": 1}])
    (message,) = queen.pop("stage-in")
    dropper.drop_next_answer()
    results = queen.transaction().ack(message).push("stage-out", [{"from": 1}]).commit()
    assert dropper.dropped == 1
    ack, push = results
    assert (ack["status"], ack["reason"]) == ("completed", "already_completed")
    assert [m["status"] for m in push["messages"]] == ["duplicate"]
    out = queen.pop("stage-out", batch=10)
    assert [m.data for m in out] == [{"from": 1}]  # pushed once
    assert queen.pop("stage-in") == []
