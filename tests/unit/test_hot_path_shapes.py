"""The fast paths of push, pop and ack give the same answers as the straightforward ones."""

from __future__ import annotations

import datetime as dt
import uuid
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from queen.api import validation as v
from queen.api.messages import message_json, messages_json, push_json
from queen.errors import InvalidInput
from queen.models import Popped, PushResult, iso
from queen.store.db import text_array
from queen.store.messages import (
    _popped_of_pops,
    _push_results,
    _push_rows,
    ack_columns,
    made_txids,
    message_uuid,
)

EAST = dt.timezone(dt.timedelta(hours=5, minutes=30))


def reference_iso(ts: dt.datetime) -> str:
    """The formatting iso() replaced: astimezone + isoformat(timespec="milliseconds")."""
    if ts.utcoffset():
        ts = ts.astimezone(dt.UTC)
    return ts.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


@pytest.mark.parametrize(
    "ts",
    [
        dt.datetime(2025, 10, 8, 5, 12, 33, 893123, tzinfo=dt.UTC),
        dt.datetime(2025, 10, 8, 5, 12, 33, 0, tzinfo=dt.UTC),  # no fraction in isoformat()
        dt.datetime(2025, 10, 8, 5, 12, 33, 999, tzinfo=dt.UTC),  # under one millisecond
        dt.datetime(2025, 10, 8, 5, 12, 33, 999999, tzinfo=dt.UTC),  # truncated, not rounded
        dt.datetime(2025, 10, 8, 5, 12, 33, 500000, tzinfo=EAST),
        dt.datetime(2025, 10, 8, 5, 12, 33, 0, tzinfo=EAST),
        dt.datetime(2025, 10, 8, 5, 12, 33, 120000),  # naive: taken as UTC
        dt.datetime(2025, 10, 8, 5, 12, 33, 120000, tzinfo=dt.timezone(dt.timedelta(0))),
        dt.datetime(1, 1, 1, tzinfo=dt.UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC),
    ],
)
def test_iso_matches_the_reference_format(ts: dt.datetime) -> None:
    assert iso(ts) == reference_iso(ts)


def test_iso_of_none() -> None:
    assert iso(None) is None


def popped(created: dt.datetime, locked: dt.datetime, lease: uuid.UUID) -> Popped:
    return Popped(
        uuid.uuid4(), "t", "q", "p", '{"a": 1}', False, 0, 0,
        created, locked, lease, locked + dt.timedelta(seconds=300), 300, 3,
    )  # fmt: skip


def test_messages_json_formats_like_message_json_and_names_the_group() -> None:
    now = dt.datetime(2025, 10, 8, 5, 12, 33, 893123, tzinfo=dt.UTC)
    lease = uuid.uuid4()
    messages = [
        popped(now, now, lease),
        popped(now + dt.timedelta(microseconds=1500), now, lease),
        popped(now, now + dt.timedelta(seconds=1), uuid.uuid4()),
    ]
    assert orjson.dumps(messages_json(messages, "billing")) == orjson.dumps(
        [{**message_json(m), "consumerGroup": "billing"} for m in messages]
    )
    assert [m["consumerGroup"] for m in messages_json(messages)] == [None] * 3


def test_push_json_echoes_the_sent_transaction_id_of_rejected_items() -> None:
    items: list[dict[str, Any]] = [
        {"queue": "q", "payload": 1, "transactionId": "a"},
        {"queue": "q", "payload": 2},
        {"queue": "q", "payload": 3, "transactionId": "c"},
    ]
    first = uuid.uuid4()
    results = [
        PushResult(1, first, "a", "queued"),
        PushResult(2, None, None, "rejected"),
        PushResult(3, None, None, "rejected"),
    ]
    assert push_json(results, items) == [
        {"id": first, "transactionId": "a", "status": "queued"},
        {"id": None, "transactionId": None, "status": "rejected", "error": "queue is full (maxSize)"},
        {"id": None, "transactionId": "c", "status": "rejected", "error": "queue is full (maxSize)"},
    ]  # fmt: skip


def test_push_items_checks_every_item_although_names_repeat() -> None:
    good = {"queue": "q", "partition": "p", "payload": 1}
    with pytest.raises(InvalidInput, match=r"invalid items\[2\]\.partition"):
        v.push_items({"items": [good, good, {**good, "partition": "-bad"}]}, b"", 10)
    with pytest.raises(InvalidInput, match=r"items\[1\]\.queue must be a string"):
        v.push_items({"items": [good, {**good, "queue": ["q"]}]}, b"", 10)
    with pytest.raises(InvalidInput, match=r"items\[1\]\.partition must be a string"):
        v.push_items({"items": [good, {**good, "partition": {"p": 1}}]}, b"", 10)


def test_acknowledgment_errors_name_the_body_or_the_batch_entry() -> None:
    with pytest.raises(InvalidInput, match=r"^body\.transactionId must be a non-empty string$"):
        v.acknowledgment({"status": "completed"})
    batch = {"acknowledgments": [{"transactionId": "a", "status": "completed"}, {"status": "x"}]}
    with pytest.raises(InvalidInput, match=r"^acknowledgments\[1\]\.transactionId must be"):
        v.acknowledgments(batch, 10)


def fake_cursor(names: list[str]) -> Any:
    """What the row factories read of a cursor: its result's column count and names."""
    result = SimpleNamespace(nfields=len(names), fname=lambda i: names[i].encode())
    return SimpleNamespace(pgresult=result)


def test_popped_rows_carry_their_pop_and_refuse_other_columns() -> None:
    """A row names its message by the bigint id; the Popped made of it has the API id."""
    record = popped(dt.datetime.now(dt.UTC), dt.datetime.now(dt.UTC), uuid.uuid4())
    names = ["pop", *Popped._fields]
    row = (3, 42, *record[1:])
    made = record._replace(id=str(message_uuid(42, record.created_at)))
    assert _popped_of_pops(fake_cursor(names))(row) == (3, made)
    with pytest.raises(TypeError):
        _popped_of_pops(fake_cursor(["pop", *Popped._fields[::-1]]))
    with pytest.raises(TypeError):
        _popped_of_pops(fake_cursor(list(Popped._fields)))


def test_push_rows_refuse_a_query_of_another_width_and_make_results() -> None:
    with pytest.raises(TypeError, match="push answered 4 columns"):
        _push_rows(fake_cursor(["idx", "message_id", "transaction_id", "status"]))
    row = _push_rows(fake_cursor(["idx", "message_id", "transaction_id", "status", "ids"]))
    assert _push_results([row((1, None, "t", "duplicate", None))]) == [
        PushResult(1, None, "t", "duplicate")
    ]


def test_a_compact_push_answer_makes_each_items_api_id_and_transaction_id() -> None:
    created = dt.datetime(2026, 12, 6, 11, 40, 5, 123456, tzinfo=dt.UTC)
    prefix = str(message_uuid(0, created))[:24]
    partition = uuid.UUID("0f8e1d2c-3b4a-4596-a7b8-c9d0e1f2a3b4")
    made = _push_results([(0, prefix, "0f8e1d2c-3b4a-8596-", "queued", [7, 2**40 + 5])])
    assert [(r.position, r.id, r.status) for r in made] == [
        (k, str(message_uuid(i, created)), "queued") for k, i in ((1, 7), (2, 2**40 + 5))
    ]
    for r, i in zip(made, (7, 2**40 + 5), strict=True):
        txid = uuid.UUID(r.transaction_id)
        assert str(txid) == r.transaction_id  # (canonical: as SQL makes it)
        assert txid.version == 8 and txid.variant == uuid.RFC_4122
        assert txid.int >> 80 == partition.int >> 80  # the partition's first 48 bits
        assert (txid.int >> 64) & 0xFFF == (partition.int >> 64) & 0xFFF  # and its next 12
        assert txid.int & (2**62 - 1) == i


def test_made_transaction_ids_carry_an_id_of_any_size() -> None:
    for i in (1, 2**48 - 1, 2**48, 2**62 - 1):
        (txid,) = made_txids(["ffffffff-ffff-8fff-"], [i])
        assert uuid.UUID(txid).int & (2**62 - 1) == i and uuid.UUID(txid).version == 8
    assert made_txids(["00000000-0000-8000-", "11111111-1111-8111-"], [1, 2]) == [
        "00000000-0000-8000-8000-000000000001", "11111111-1111-8111-8000-000000000002"]


def test_ack_columns_send_one_value_a_request_when_its_items_agree() -> None:
    lease = "0190a1b2-0000-7000-8000-000000000001"
    alike = [{"transactionId": f"t{i}", "status": "completed", "leaseId": lease}
             for i in range(3)]
    failed = {"transactionId": "u", "status": "failed", "error": "e"}
    shared = ack_columns([*alike, failed], [3, 1])
    assert shared["per_request"] is True
    assert shared["txids"] == text_array(["t0", "t1", "t2", "u"])
    assert shared["statuses"] == text_array(["completed", "failed"])
    assert shared["leases"] == text_array([lease, None])
    assert shared["errors"] == text_array([None, "e"])
    assert shared["groups"] is None
    # Items of one request that differ in anything but their transactionIds: one an item.
    mixed = ack_columns([*alike[:2], {**alike[2], "leaseId": None}])
    assert mixed["per_request"] is False
    assert mixed["leases"] == text_array([lease, lease, None])
    # Requests of one item each: nothing to share.
    assert ack_columns(alike, [1, 1, 1])["per_request"] is False
