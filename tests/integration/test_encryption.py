"""Payloads of encryptionEnabled queues are stored sealed and handed out in the clear."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from queen.errors import InvalidInput
from queen.store import Store
from queen.store.db import Database
from tests.integration.helpers import data, pop, push, rows
from tests.storage import MESSAGES

KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"


@pytest.fixture
def sealed_store(db_dsn: str) -> Iterator[Store]:
    s = Store(Database(db_dsn, pool_size=4), encryption_key=KEY)
    s.db.pool.open(wait=True)
    yield s
    s.close()


def test_encrypted_queue_round_trip(sealed_store: Store) -> None:
    sealed_store.queues.configure("secret", None, None, {"encryption_enabled": True})
    push(
        sealed_store,
        [
            {"queue": "secret", "payload": {"card": "4111"}, "transactionId": "s1"},
            {"queue": "plain", "payload": {"card": "visible"}, "transactionId": "p1"},
        ],
    )
    stored = dict(
        (t, (e, p))
        for t, e, p in rows(
            sealed_store.db.dsn, f"SELECT transaction_id, encrypted, payload FROM {MESSAGES}"
        )
    )
    assert stored["s1"][0] is True
    assert set(stored["s1"][1]) == {"iv", "tag", "data"}
    assert "4111" not in orjson.dumps(stored["s1"][1]).decode()
    assert stored["p1"] == (False, {"card": "visible"})
    (m,) = pop(sealed_store, "secret")
    assert data(m) == {"card": "4111"}
    (m,) = pop(sealed_store, "plain")
    assert data(m) == {"card": "visible"}


def test_client_cannot_mark_its_payload_encrypted(store: Store) -> None:
    push(store, [{"queue": "q", "payload": {"a": 1}, "encrypted": True, "transactionId": "c"}])
    assert rows(store.db.dsn, f"SELECT encrypted FROM {MESSAGES}") == [(False,)]
    (m,) = pop(store, "q")
    assert data(m) == {"a": 1}


def test_encrypted_queue_without_a_key_refuses_the_push(store: Store) -> None:
    store.queues.configure("secret", None, None, {"encryption_enabled": True})
    with pytest.raises(InvalidInput, match="QUEEN_ENCRYPTION_KEY"):
        push(store, [{"queue": "secret", "payload": 1}])
    assert rows(store.db.dsn, f"SELECT count(*) FROM {MESSAGES}") == [(0,)]


@pytest.mark.parametrize("key", ["\\u0065ncrypted", "encr\\u0079pted"])
def test_client_cannot_mark_its_payload_encrypted_with_an_escaped_key(
    store: Store, key: str
) -> None:
    """The marker written with JSON escapes is the same key once parsed: it counts no more
    than the plain one (and, not a boolean, it fails nothing)."""
    for value in ("true", '"yes"', '"maybe"'):
        item = '{"queue": "q", "payload": {"a": 1}, "' + key + '": ' + value + "}"
        raw = ('{"items": [' + item + "]}").encode()
        items = orjson.loads(raw)["items"]
        assert "encrypted" in items[0]
        (result,) = store.messages.push(raw, items)
        assert result.status == "queued"
    assert rows(store.db.dsn, f"SELECT encrypted FROM {MESSAGES}") == [(False,)] * 3
    assert [data(m) for m in pop(store, "q", batch=3)] == [{"a": 1}] * 3
