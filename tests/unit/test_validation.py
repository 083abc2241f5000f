"""Request input checks (queen.api.validation): what is accepted, what is refused and why."""

from __future__ import annotations

import orjson
import pytest

from queen.api import validation as v
from queen.errors import InvalidInput, PayloadTooLarge
from queen.models import QUEUE_OPTIONS

# -- JSON bodies -------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"not json", b'{"a": 1,}', b"\xff\xfe", b'{"a": NaN}', b'{"a": "\x01"}'],
)
def test_parse_json_object_refuses_malformed(body: bytes) -> None:
    with pytest.raises(InvalidInput):
        v.parse_json_object(body)


@pytest.mark.parametrize("body", [b"[]", b"[1, 2]", b'"items"', b"42", b"null", b"true"])
def test_parse_json_object_refuses_non_objects(body: bytes) -> None:
    with pytest.raises(InvalidInput, match="JSON object"):
        v.parse_json_object(body)


def test_parse_json_object_returns_the_object() -> None:
    assert v.parse_json_object(b' {"items": [1]} ') == {"items": [1]}


# -- names -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["emails", "a", "Default", "q.1", "billing:eu-west_1", "x@y", "0", "a" * 128, "A-b.C_d:e@f"],
)
def test_name_accepts(value: str) -> None:
    assert v.name(value, "queue") == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "a b",
        "a/b",
        "/a",
        "a\\b",
        "-a",
        ".a",
        "_a",
        "a" * 129,
        "caf\u00e9",
        "\u961f\u5217",
        "a\x00",
        "a\n",
        "\na",
        "a\t",
        "a%2Fb",
        "a?b",
        "a#b",
        "a*",
    ],
)
def test_name_refuses(value: str) -> None:
    with pytest.raises(InvalidInput, match="queue"):
        v.name(value, "queue")


@pytest.mark.parametrize("value", [1, 1.5, True, [], {}, ["q"]])
def test_name_refuses_non_strings(value: object) -> None:
    with pytest.raises(InvalidInput, match="must be a string"):
        v.name(value, "queue")


def test_name_required_and_optional() -> None:
    with pytest.raises(InvalidInput):
        v.name(None, "queue")
    assert v.name(None, "partition", required=False) is None
    with pytest.raises(InvalidInput):
        v.name("", "partition", required=False)


# -- push items --------------------------------------------------------------------


def _push(doc: object, max_items: int = 1000) -> list[dict[str, object]]:
    raw = orjson.dumps(doc)
    return v.push_items(v.parse_json_object(raw), raw, max_items)


def test_push_items_accepts_a_valid_batch() -> None:
    doc = {
        "items": [
            {"queue": "q", "payload": {"a": 1}},
            {"queue": "q", "partition": "p", "payload": None, "transactionId": "t-1"},
            {"queue": "q", "partition": None, "payload": [1, "x"], "transactionId": None},
            {"queue": "q", "payload": "text"},
        ]
    }
    assert _push(doc) == doc["items"]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "items must be an array"),
        ({"items": None}, "items must be an array"),
        ({"items": {"queue": "q"}}, "items must be an array"),
        ({"items": "q"}, "items must be an array"),
        ({"items": []}, "must not be empty"),
        ({"items": [1]}, r"items\[0\] must be an object"),
        ({"items": [[]]}, r"items\[0\] must be an object"),
        ({"items": [{"payload": 1}]}, r"items\[0\]\.queue"),
        ({"items": [{"queue": 5, "payload": 1}]}, r"items\[0\]\.queue"),
        ({"items": [{"queue": "a b", "payload": 1}]}, r"items\[0\]\.queue"),
        ({"items": [{"queue": "q"}]}, r"items\[0\]\.payload is required"),
        ({"items": [{"queue": "q", "payload": 1, "partition": 7}]}, r"items\[0\]\.partition"),
        ({"items": [{"queue": "q", "payload": 1, "partition": ""}]}, r"items\[0\]\.partition"),
        ({"items": [{"queue": "q", "payload": 1, "transactionId": 7}]}, "transactionId"),
        ({"items": [{"queue": "q", "payload": 1, "transactionId": ""}]}, "transactionId"),
        ({"items": [{"queue": "q", "payload": 1, "transactionId": ["x"]}]}, "transactionId"),
        ({"items": [{"queue": "q", "payload": 1, "transactionId": "x" * 256}]}, "longer"),
        (
            {"items": [{"queue": "q", "payload": 1}, {"queue": "", "payload": 1}]},
            r"items\[1\]\.queue",
        ),
    ],
)
def test_push_items_refuses(doc: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        _push(doc)


def test_push_items_limit_is_payload_too_large() -> None:
    items = [{"queue": "q", "payload": i} for i in range(11)]
    assert len(_push({"items": items[:10]}, max_items=10)) == 10
    with pytest.raises(PayloadTooLarge):
        _push({"items": items}, max_items=10)


@pytest.mark.parametrize(
    "payload",
    [
        "a\x00b",
        {"k": "\x00"},
        {"k\x00": 1},
        [1, [2, ["\x00"]]],
        {"deep": {"er": [{"x": "ok"}, {"y": "bad\x00"}]}},
    ],
)
def test_push_items_refuses_nul_anywhere_in_payload(payload: object) -> None:
    with pytest.raises(InvalidInput, match="NUL"):
        _push({"items": [{"queue": "q", "payload": payload}]})


def test_push_items_refuses_nul_in_transaction_id() -> None:
    with pytest.raises(InvalidInput, match="NUL"):
        _push({"items": [{"queue": "q", "payload": 1, "transactionId": "t\x00"}]})


def test_push_items_accepts_an_escaped_backslash_u0000_text() -> None:
    # The six characters \u0000 (escaped backslash) are ordinary text, not NUL.
    raw = b'{"items": [{"queue": "q", "payload": "C:\\\\u0000"}]}'
    (item,) = v.push_items(v.parse_json_object(raw), raw, 10)
    assert item["payload"] == "C:\\u0000"


# -- acknowledgments ---------------------------------------------------------------


def test_acknowledgment_accepts_and_normalises() -> None:
    assert v.acknowledgment({"transactionId": "t", "status": "completed"}) == {
        "transactionId": "t",
        "status": "completed",
        "error": None,
    }
    ack = v.acknowledgment({"transactionId": "t", "status": "failed", "error": "boom\x00!"})
    assert ack == {"transactionId": "t", "status": "failed", "error": "boom!"}
    long = v.acknowledgment({"transactionId": "t", "status": "failed", "error": "e" * 20_000})
    assert len(long["error"]) == v.MAX_ERROR_TEXT


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (None, "must be an object"),
        ("t", "must be an object"),
        ({}, "transactionId"),
        ({"status": "completed"}, "transactionId"),
        ({"transactionId": 1, "status": "completed"}, "transactionId"),
        ({"transactionId": "", "status": "completed"}, "transactionId"),
        ({"transactionId": "t\x00", "status": "completed"}, "NUL"),
        ({"transactionId": "t"}, "status"),
        ({"transactionId": "t", "status": "done"}, "status"),
        ({"transactionId": "t", "status": "COMPLETED"}, "status"),
        ({"transactionId": "t", "status": True}, "status"),
        ({"transactionId": "t", "status": "failed", "error": 5}, "error"),
        ({"transactionId": "t", "status": "failed", "error": {"m": 1}}, "error"),
    ],
)
def test_acknowledgment_refuses(item: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        v.acknowledgment(item)


def test_acknowledgments_batch() -> None:
    acks = v.acknowledgments(
        {"acknowledgments": [{"transactionId": "a", "status": "completed"}]}, 10
    )
    assert [a["transactionId"] for a in acks] == ["a"]
    with pytest.raises(InvalidInput, match="acknowledgments must be an array"):
        v.acknowledgments({}, 10)
    with pytest.raises(InvalidInput, match="must not be empty"):
        v.acknowledgments({"acknowledgments": []}, 10)
    with pytest.raises(InvalidInput, match=r"acknowledgments\[1\]\.status"):
        v.acknowledgments(
            {
                "acknowledgments": [
                    {"transactionId": "a", "status": "completed"},
                    {"transactionId": "b", "status": "nope"},
                ]
            },
            10,
        )
    many = [{"transactionId": str(i), "status": "completed"} for i in range(11)]
    with pytest.raises(PayloadTooLarge):
        v.acknowledgments({"acknowledgments": many}, 10)


# -- queue options -----------------------------------------------------------------


def test_queue_options_maps_every_option_to_its_column() -> None:
    given = {o.name: (not o.default if o.type is bool else 7) for o in QUEUE_OPTIONS}
    columns = v.queue_options(given)
    assert columns == {o.column: given[o.name] for o in QUEUE_OPTIONS}
    assert len(columns) == 14


def test_queue_options_empty() -> None:
    assert v.queue_options(None) == {}
    assert v.queue_options({}) == {}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([], "options must be an object"),
        ("x", "options must be an object"),
        (5, "options must be an object"),
        ({"leaseTimeout": 5}, "unknown option 'leaseTimeout'"),
        ({"namespace": "x"}, "unknown option"),
        ({"lease_time": 5}, "unknown option"),
        ({"leaseTime": "5"}, "integer"),
        ({"leaseTime": 5.5}, "integer"),
        ({"leaseTime": 5.0}, "integer"),
        ({"leaseTime": True}, "integer"),
        ({"leaseTime": None}, "integer"),
        ({"leaseTime": 0}, "leaseTime"),
        ({"leaseTime": -1}, "leaseTime"),
        ({"retryLimit": -1}, "retryLimit"),
        ({"maxSize": -5}, "maxSize"),
        ({"ttl": 2**31}, "ttl"),
        ({"priority": 2**31}, "priority"),
        ({"priority": -(2**31) - 1}, "priority"),
        ({"delayedProcessing": -1}, "delayedProcessing"),
        ({"dlqAfterMaxRetries": 1}, "boolean"),
        ({"dlqAfterMaxRetries": "true"}, "boolean"),
        ({"encryptionEnabled": None}, "boolean"),
        ({"retentionEnabled": 0}, "boolean"),
    ],
)
def test_queue_options_refuses(options: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        v.queue_options(options)


def test_queue_options_ranges() -> None:
    assert v.queue_options({"priority": -5}) == {"priority": -5}
    assert v.queue_options({"retryLimit": 0}) == {"retry_limit": 0}
    assert v.queue_options({"leaseTime": 1}) == {"lease_time": 1}
    assert v.queue_options({"maxSize": 2**31 - 1}) == {"max_size": 2**31 - 1}


# -- query parameters --------------------------------------------------------------


@pytest.mark.parametrize(("raw", "expected"), [(None, 1), ("", 1), ("1", 1), ("1000", 1000)])
def test_int_param_accepts(raw: str | None, expected: int) -> None:
    params = {} if raw is None else {"batch": raw}
    assert v.int_param(params, "batch", 1, 1, 1000) == expected


@pytest.mark.parametrize(
    "raw", ["0", "1001", "-1", "abc", "1.5", "1e3", "0x10", " 5", "5 ", "1_0", "\u0665", "9" * 5000]
)
def test_int_param_refuses(raw: str) -> None:
    with pytest.raises(InvalidInput, match="batch"):
        v.int_param({"batch": raw}, "batch", 1, 1, 1000)


def test_int_param_refuses_repeated_parameter() -> None:
    # Falcon hands a repeated query parameter over as a list.
    with pytest.raises(InvalidInput, match="batch"):
        v.int_param({"batch": ["1", "2"]}, "batch", 1, 1, 1000)  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, False),
        ("", False),
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("false", False),
        ("0", False),
        ("no", False),
    ],
)
def test_bool_param_accepts(raw: str | None, expected: bool) -> None:
    params = {} if raw is None else {"wait": raw}
    assert v.bool_param(params, "wait") is expected


@pytest.mark.parametrize("raw", ["maybe", "2", "on?", "t rue"])
def test_bool_param_refuses(raw: str) -> None:
    with pytest.raises(InvalidInput, match="wait"):
        v.bool_param({"wait": raw}, "wait")


def test_bool_param_refuses_repeated_parameter() -> None:
    with pytest.raises(InvalidInput, match="wait"):
        v.bool_param({"wait": ["true", "false"]}, "wait")  # type: ignore[dict-item]


def test_bool_param_default() -> None:
    assert v.bool_param({}, "wait", default=True) is True
