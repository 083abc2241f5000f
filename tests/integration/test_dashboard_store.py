"""The dashboard's read queries against a real database."""

from __future__ import annotations

import orjson

from queen.models import PopRoute


def push(store, *items):
    body = orjson.dumps({"items": list(items)})
    return store.messages.push(body, list(items))


def test_depths_count_every_partition_and_empty_queues(store):
    push(store, {"queue": "q1", "payload": 1}, {"queue": "q1", "partition": "b", "payload": 2},
         {"queue": "q1", "partition": "b", "payload": 3})
    store.queues.configure("empty", "ns", None, {})
    (popped,) = store.messages.pop(PopRoute(queue="q1", partition="Default"), 1, "w")
    depths = {(d.queue, d.partition): d for d in store.dashboard.depths()}
    assert depths[("q1", "Default")].processing == 1
    assert depths[("q1", "Default")].pending == 0
    assert depths[("q1", "b")].pending == 2
    assert depths[("empty", None)].namespace == "ns"
    assert depths[("empty", None)].pending == 0


def test_locate_names_queue_and_partition(store):
    (r,) = push(store, {"queue": "q1", "partition": "p", "payload": 1})
    places = store.dashboard.locate([r.transaction_id, "unknown"])
    assert set(places) == {r.transaction_id}
    assert places[r.transaction_id].queue == "q1"
    assert places[r.transaction_id].partition == "p"
    assert store.dashboard.locate([]) == {}


def test_oldest_pending_skips_what_is_leased_or_done(store):
    for n in range(3):
        push(store, {"queue": "span", "partition": "p", "payload": n})
    (first,) = store.analytics.message_span("span").values()
    assert first.oldest_pending == first.oldest

    store.messages.pop(PopRoute(queue="span", partition="p"), 1, "w")
    (leased,) = store.analytics.message_span("span").values()
    assert first.oldest < leased.oldest_pending < leased.newest

    push(store, {"queue": "drained", "payload": 1}, {"queue": "drained", "payload": 2})
    store.messages.pop(PopRoute(queue="drained", partition="Default"), 2, "w")
    (drained,) = store.analytics.message_span("drained").values()
    assert drained.oldest_pending is None
    assert drained.oldest is not None  # the leased messages are still there
