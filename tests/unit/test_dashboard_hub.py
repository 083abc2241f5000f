"""The dashboard hub, its clients and event shapes, with fake sockets and no database."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import queue
import threading
import time
import uuid
import weakref
from typing import Any

from queen.dashboard import formats, relay
from queen.dashboard.client import DashboardClient, frame_text, text_frame
from queen.dashboard.hub import SAMPLE_EVENTS, Hub, RateBudget
from queen.dashboard.ticker import Ticker
from queen.errors import Unavailable
from queen.models import AckResult, Popped, PushResult
from queen.store.dashboard import MessagePlace, PartitionDepth, RecentActivity

NOW = dt.datetime(2025, 10, 8, 7, 30, tzinfo=dt.UTC)
# How long a test waits for what must come (a bound only a stalled machine could reach: the
# 2 s it was once ran out on a loaded 2-core machine); the short windows below check that
# nothing more comes.
WAIT_S = 20.0


class FakeSocket:
    """A socket fed by the test; what the server sends lands in `sent`."""

    def __init__(self, block_sends: bool = False) -> None:
        self.incoming: queue.Queue[str | None] = queue.Queue()
        self.sent: queue.Queue[str] = queue.Queue()
        self.unblock = threading.Event()
        if not block_sends:
            self.unblock.set()
        self.closed = False

    def receive(self) -> str | None:
        return self.incoming.get()

    def send(self, message: str) -> None:
        self.unblock.wait()
        self.sent.put(message)

    def close(self) -> None:
        self.closed = True
        self.incoming.put(None)

    def next_event(self, timeout: float = WAIT_S) -> dict[str, Any]:
        while True:
            frame = self.sent.get(timeout=timeout)
            if frame != "pong":
                return json.loads(frame)

    def wait_for(self, name: str, timeout: float = WAIT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.next_event(max(0.01, deadline - time.monotonic()))
            if event["event"] == name:
                return event


def popped(txid: str, queue_name: str = "q", partition: str = "p") -> Popped:
    return Popped(uuid.uuid4(), txid, queue_name, partition, "{}", False, 0, 0, NOW, NOW,
                  uuid.uuid4(), NOW, 300, 3)


def depth(queue_name: str, partition: str | None, pending: int = 0, processing: int = 0,
          completed: int = 0) -> PartitionDepth:
    return PartitionDepth(queue_name, None, None, partition, pending, processing, completed, 0, 0)


class FakeStore:
    def __init__(self) -> None:
        self.rows: list[PartitionDepth] = []
        self.fail = False

    def depths(self) -> list[PartitionDepth]:
        if self.fail:
            raise Unavailable("database unavailable")
        return list(self.rows)

    def recent(self) -> RecentActivity:
        return RecentActivity(7, 5)

    def locate(self, ids: list[str]) -> dict[str, MessagePlace]:
        return {i: MessagePlace(i, "q", "p") for i in ids}


def serve(hub: Hub, sock: FakeSocket) -> threading.Thread:
    thread = threading.Thread(target=hub.serve, args=(sock,), daemon=True)
    thread.start()
    sock.wait_for("client.connected")
    return thread


# -- formats ------------------------------------------------------------------------


def test_pushed_skips_duplicates_and_defaults_the_partition():
    items = [{"queue": "a", "payload": 1}, {"queue": "a", "partition": "x", "payload": 2}]
    results = [PushResult(1, uuid.uuid4(), "t1", "queued"), PushResult(2, None, "t2", "duplicate")]
    (event,) = formats.pushed(items, results)
    assert event == formats.Event(
        "message.pushed", {"queue": "a", "partition": "Default", "transactionId": "t1"}, "a")


def test_acked_maps_statuses_and_places():
    acks = [{"transactionId": t, "status": s, "error": e} for t, s, e in
            [("t1", "completed", None), ("t2", "failed", "boom"), ("t3", "failed", "x"),
             ("t4", "completed", None)]]
    results = [AckResult(1, "t1", "completed", None, NOW),
               AckResult(2, "t2", "retry_scheduled", 2, NOW),
               AckResult(3, "t3", "dead_letter", None, NOW),
               AckResult(4, "t4", "not_found", None, NOW)]
    events = list(formats.acked(acks, results, {"t1": MessagePlace("t1", "q", "p")}))
    assert [e.name for e in events] == ["message.completed", "message.failed", "message.failed"]
    assert events[0].data == {"transactionId": "t1", "queue": "q", "partition": "p"}
    assert events[1].data == {"transactionId": "t2", "error": "boom",
                              "status": "retry_scheduled", "retryCount": 2}
    assert events[1].queue is None  # not located: only unfiltered dashboards get it
    assert formats.acked_ids(formats.ACKED, (acks, results)) == ["t1", "t2", "t3"]


def test_queue_depths_group_partitions_and_keep_empty_queues():
    rows = [depth("a", "p1", 2, 1, 5), depth("a", "p2", 3), depth("b", None)]
    a, b = formats.queue_depths(rows)
    assert (a.data["totalDepth"], a.data["totalProcessing"], a.data["totalCompleted"]) == (5, 1, 5)
    assert a.data["partitions"]["p1"] == {
        "depth": 2, "processing": 1, "completed": 5, "failed": 0, "deadLetter": 0}
    assert b.data["partitions"] == {} and b.data["totalDepth"] == 0
    assert formats.partition_depth(rows[0]).data["total"] == 8


def test_timestamps_are_iso_utc_with_milliseconds():
    text = formats.encode("x", {}, formats.now_iso())
    stamp = json.loads(text)["timestamp"]
    assert len(stamp) == 24 and stamp.endswith("Z") and stamp[19] == "."


# -- clients ------------------------------------------------------------------------


def test_a_slow_client_never_blocks_and_keeps_the_newest_frames():
    sock = FakeSocket(block_sends=True)
    client = DashboardClient(sock, buffer_size=3)
    client.start_writer()
    started = time.monotonic()
    for i in range(100):
        client.send(str(i))
    assert time.monotonic() - started < WAIT_S  # blocked sends would hang it
    sock.unblock.set()
    received = [sock.sent.get(timeout=WAIT_S) for _ in range(3)]
    with contextlib.suppress(queue.Empty):
        received.append(sock.sent.get(timeout=0.3))
    # The writer may have taken "0" before blocking; after it, only the newest three survive.
    assert received[-3:] == ["97", "98", "99"]
    assert client.dropped >= 96
    client.close()


def test_subscription_filter():
    client = DashboardClient(FakeSocket(), 10)
    assert client.wants("a") and client.wants(None)
    client.queues = frozenset({"a"})
    assert client.wants("a") and client.wants(None) and not client.wants("b")


def test_text_frames_are_the_ones_gevent_websocket_builds():
    from geventwebsocket.websocket import Header, WebSocket  # type: ignore[import-untyped]

    for size in (0, 1, 125, 126, 65535, 65536, 70000):
        payload = ("é" * (size // 2) + "x" * (size % 2)).encode()
        header = Header.encode_header(True, WebSocket.OPCODE_TEXT, b"", len(payload), 0)
        assert text_frame(payload) == bytes(header) + payload
        assert frame_text(text_frame(payload)) == payload.decode()


class RawStream:
    """gevent-websocket's stream: write is the connection's sendall. The first write
    waits for `release`, so that frames queue up behind it."""

    def __init__(self) -> None:
        self.writes: queue.Queue[bytes] = queue.Queue()
        self.writing = threading.Event()
        self.release = threading.Event()

    def write(self, data: bytes) -> None:
        self.writing.set()
        self.release.wait()
        self.writes.put(data)


class RawSocket(FakeSocket):
    def __init__(self) -> None:
        super().__init__()
        self.stream = RawStream()

    def send(self, message: str) -> None:
        raise AssertionError("frames go to the stream in one write")


def test_a_writer_writes_every_frame_it_finds_queued_in_one_go():
    sock = RawSocket()
    client = DashboardClient(sock, buffer_size=10)
    client.start_writer()
    client.send("first")
    assert sock.stream.writing.wait(WAIT_S)
    for text in ("a", "b" * 200, "c"):  # queued while the first write is under way
        client.send(text)
    sock.stream.release.set()
    assert sock.stream.writes.get(timeout=WAIT_S) == text_frame(b"first")
    together = sock.stream.writes.get(timeout=WAIT_S)
    assert together == text_frame(b"a") + text_frame(b"b" * 200) + text_frame(b"c")
    client.close()


def test_rate_budget_resets_every_second():
    now = [0.0]
    budget = RateBudget(5, clock=lambda: now[0])
    assert [budget.take(2), budget.take(2), budget.take(2), budget.take(1)] == [2, 2, 1, 0]
    now[0] = 1.0
    assert budget.take(9) == 5


# -- hub ----------------------------------------------------------------------------


def test_publishing_without_dashboards_does_nothing():
    hub = Hub(None, "w1")
    hub.publish(formats.PROCESSING, [popped("t1")])
    assert not hub.listening and not hub._inbox


def test_hub_serves_connect_ping_subscribe_and_disconnect():
    hub = Hub(FakeStore(), "w1", depth_interval_s=60, stats_interval_s=60,  # type: ignore[arg-type]
              flush_interval_s=0.05)
    sock = FakeSocket()
    thread = serve(hub, sock)
    assert hub.listening and hub.connections == 1

    sock.incoming.put("ping")
    while sock.sent.get(timeout=WAIT_S) != "pong":
        pass
    sock.incoming.put(json.dumps({"type": "subscribe", "queues": ["q", 3]}))
    assert sock.wait_for("subscribed")["data"] == {"queues": ["q"]}

    hub.publish(formats.PROCESSING, [popped("other", "elsewhere"), popped("t1")])
    event = sock.wait_for("message.processing")
    assert event["data"] == {"queue": "q", "partition": "p", "transactionId": "t1",
                             "workerId": "w1"}

    acks = [{"transactionId": "t1", "status": "completed", "error": None}]
    hub.publish(formats.ACKED, acks, [AckResult(1, "t1", "completed", None, NOW)])
    assert sock.wait_for("message.completed")["data"]["queue"] == "q"  # located by the store

    sock.incoming.put(None)  # peer went away
    thread.join(2)
    assert not thread.is_alive()
    assert not hub.listening and hub.connections == 0


def test_ticker_reports_depths_changes_and_new_queues():
    store = FakeStore()
    store.rows = [depth("a", "p1", 1), depth("a", "p2", 1)]
    ticker = Ticker(store)  # type: ignore[arg-type]
    first = ticker.depth_events()
    assert [e.name for e in first] == ["queue.depth", "partition.depth", "partition.depth"]

    store.rows = [depth("a", "p1", 1), depth("a", "p2", 2), depth("b", "Default", 1)]
    names = [(e.name, e.data.get("partition")) for e in ticker.depth_events()]
    assert names == [("queue.created", "Default"), ("queue.depth", None), ("queue.depth", None),
                     ("partition.depth", "p2"), ("partition.depth", "Default")]

    stats = ticker.stats_event(connections=3, dropped=0)
    assert stats is not None
    assert stats.data["pending"] == 4 and stats.data["recentCreated"] == 7
    assert stats.data["connections"] == 3
    events, stamp = ticker.replay(max_age_s=60)
    assert len(events) == 2 and stamp

    store.fail = True
    assert ticker.depth_events() == [] and ticker.failing


def test_events_over_the_budget_are_dropped_and_counted():
    hub = Hub(None, "w1", max_events_per_s=2, flush_interval_s=0.05)
    sock = FakeSocket()
    thread = serve(hub, sock)
    hub.publish(formats.PROCESSING, [popped(f"t{i}") for i in range(5)])
    got = [sock.wait_for("message.processing")["data"]["transactionId"] for _ in range(2)]
    assert got == ["t0", "t1"]
    deadline = time.monotonic() + WAIT_S
    while hub.dropped_events < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hub.dropped_events == 3
    sock.incoming.put(None)
    thread.join(2)


# -- cluster relay ------------------------------------------------------------------


class Bus:
    """Stands in for NOTIFY: every note reaches every hub, the sender's own included."""

    def __init__(self) -> None:
        self.hubs: list[Hub] = []
        self.notes: list[str] = []

    def send(self, payload: str) -> None:
        assert len(payload.encode()) < 8000
        self.notes.append(payload)
        for hub in self.hubs:
            hub.receive(payload)


def linked_hubs(*names: str, clock: Any = time.monotonic) -> tuple[Bus, list[Hub]]:
    bus = Bus()
    hubs = [Hub(FakeStore(), name, depth_interval_s=60, stats_interval_s=60,  # type: ignore[arg-type]
                relay_note=bus.send, clock=clock, flush_interval_s=0.05) for name in names]
    bus.hubs = hubs
    return bus, hubs


def test_a_batch_stays_under_the_notify_limit_and_counts_what_it_leaves_out():
    events = [(formats.Event("message.pushed", {"queue": "q", "transactionId": f"t{i:05}",
                                                "partition": "p" * 40}, "q"), "ts")
              for i in range(1000)]
    counts = {"q": {"message.pushed": 1000}}
    payload = relay.encode_batch("w1", iter(events), counts, total=1000, lost=5)
    assert len(payload.encode()) <= relay.PAYLOAD_LIMIT
    batch = relay.decode(payload)
    assert isinstance(batch, relay.Batch)
    assert 0 < len(batch.events) < 1000
    assert batch.dropped == 5 + 1000 - len(batch.events)
    assert batch.counts == counts and batch.worker == "w1"
    assert batch.events[0] == events[0]


def test_counts_of_many_queues_keep_the_busiest_and_fold_the_rest():
    counts = {f"queue-{i:04}": {"message.pushed": i + 1, "message.completed": 1}
              for i in range(500)}
    kept = relay.bounded_counts(counts)
    assert len(json.dumps(kept, separators=(",", ":"))) <= relay.COUNTS_LIMIT + 100
    assert "queue-0499" in kept and "queue-0000" not in kept
    total = sum(n for c in kept.values() for n in c.values())
    assert total == sum(n for c in counts.values() for n in c.values())
    assert relay.decode("not json") is None and relay.decode('{"type": "x"}') is None


def test_tally_counts_per_queue_and_kind_without_events():
    counts: dict[str, dict[str, int]] = {}
    items = [{"queue": "a"}, {"queue": "b"}, {"queue": "a"}]
    results = [PushResult(1, None, "t1", "queued"), PushResult(2, None, "t2", "queued"),
               PushResult(3, None, "t3", "duplicate")]
    formats.tally(counts, formats.PUSHED, (items, results), {})
    acks = [{"transactionId": "t1"}, {"transactionId": "t2"}]
    acked = [AckResult(1, "t1", "completed", None, NOW), AckResult(2, "t2", "dead_letter", None, NOW)]
    formats.tally(counts, formats.ACKED, (acks, acked), {"t1": MessagePlace("t1", "a", "p")})
    assert counts == {"a": {"message.pushed": 1, "message.completed": 1},
                      "b": {"message.pushed": 1}, "": {"message.failed": 1}}


def test_tally_of_one_queue_counts_as_the_record_by_record_count_does():
    items = [{"queue": "a"}] * 4
    results = [PushResult(1, None, "t1", "queued"), PushResult(2, None, "t2", "duplicate"),
                PushResult(3, None, "t3", "rejected"), PushResult(4, None, "t4", "queued")]
    acks = [{"transactionId": f"t{i}"} for i in range(5)]
    acked = [AckResult(1, "t0", "completed", None, NOW), AckResult(2, "t1", "retry_scheduled", 1, NOW),
             AckResult(3, "t2", "not_found", None, NOW), AckResult(4, "t3", "failed", None, NOW),
             AckResult(5, "t4", "completed", None, NOW)]
    counts: dict[str, dict[str, int]] = {}
    formats.tally(counts, formats.PUSHED, (items, results), {})
    formats.tally(counts, formats.PUSHED, ([], []), {})
    formats.tally(counts, formats.PROCESSING, ([popped("x", "a"), popped("y", "a")],), {})
    formats.tally(counts, formats.PROCESSING, ([popped("z", "a"), popped("w", "b")],), {})
    formats.tally(counts, formats.ACKED, (acks, acked), {})  # none located: all under other
    assert counts == {"a": {"message.pushed": 2, "message.processing": 3},
                      "b": {"message.processing": 1},
                      "": {"message.completed": 2, "message.failed": 2}}


def test_events_of_a_worker_without_sockets_reach_the_sockets_of_another():
    bus, (watched, other) = linked_hubs("w1", "w2")
    assert not other.listening
    sock = FakeSocket()
    thread = serve(watched, sock)
    deadline = time.monotonic() + WAIT_S
    while not other.listening and time.monotonic() < deadline:
        time.sleep(0.01)
    assert other.listening  # w1's presence note arrived

    other.publish(formats.PROCESSING, [popped("from-w2")])
    watched.publish(formats.PROCESSING, [popped("from-w1")])
    got = {sock.wait_for("message.processing")["data"]["workerId"] for _ in range(2)}
    assert got == {"w1", "w2"}
    summary = sock.wait_for("events.summary")["data"]
    assert summary["totals"] == {"message.processing": 1} and summary["dropped"] == 0
    with contextlib.suppress(queue.Empty):  # each event once, though both hubs received both
        while True:
            event = sock.next_event(timeout=0.6)
            assert event["event"] != "message.processing"
    sock.incoming.put(None)
    thread.join(2)


def test_a_worker_stops_publishing_when_presence_notes_stop():
    now = [1000.0]
    bus, (watched, other) = linked_hubs("w1", "w2", clock=lambda: now[0])
    bus.send(relay.presence("w1"))
    assert other.listening and not watched.listening  # a worker ignores its own notes
    now[0] += relay.PRESENCE_TTL_S - 1
    bus.send(relay.encode_batch("w2", [], {"q": {"message.pushed": 1}}, 1))  # not presence
    now[0] += 2
    deadline = time.monotonic() + WAIT_S
    while other.listening and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not other.listening  # batches alone never keep workers publishing to each other
    other.publish(formats.PROCESSING, [popped("late")])
    assert not other._inbox


def test_batched_clients_get_queue_depths_without_a_flood_of_partition_depths():
    store = FakeStore()
    store.rows = [depth("big", f"p{i:04}", 1) for i in range(1500)]
    # An outbox that holds several whole snapshots: with a smaller one, a snapshot taken
    # before the subscription is read may push out the frames this test waits for (as a
    # full outbox should) when the writer lags on a loaded machine.
    hub = Hub(store, "w1", depth_interval_s=0.2, stats_interval_s=60,  # type: ignore[arg-type]
              client_buffer=20_000, flush_interval_s=0.05)
    sock = FakeSocket()
    sock.incoming.put(json.dumps({"type": "subscribe", "queues": [], "batch": True}))
    thread = serve(hub, sock)
    # The snapshot taken as it connected may come before its subscription is read (every
    # partition then, as for any client); the snapshots after it carry queue depths only.
    sock.wait_for("subscribed")
    for _ in range(3):  # the replay on subscribing, then snapshots taken after it
        depth_event = sock.wait_for("queue.depth")
        assert len(depth_event["data"]["partitions"]) == 1500
    with contextlib.suppress(queue.Empty):
        deadline = time.monotonic() + 1.0  # about five more snapshots
        while time.monotonic() < deadline:
            assert sock.next_event(timeout=0.3)["event"] != "partition.depth"
    sock.incoming.put(None)
    thread.join(2)


def test_a_subscription_gets_the_latest_queue_depths_it_wants_at_once():
    store = FakeStore()
    store.rows = [depth("a", "p", 1), depth("b", "p", 2)]
    hub = Hub(store, "w1", depth_interval_s=60, stats_interval_s=60,  # type: ignore[arg-type]
              client_buffer=1000, flush_interval_s=0.05)
    sock = FakeSocket()
    thread = serve(hub, sock)
    deadline = time.monotonic() + WAIT_S  # the one snapshot of the minute, before subscribing
    while not hub._ticker.replay(max_age_s=60)[0] and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.01)
    sock.incoming.put(json.dumps({"type": "subscribe", "queues": ["b"], "batch": True}))
    sock.wait_for("subscribed")
    assert sock.wait_for("queue.depth")["data"]["queue"] == "b"  # not a minute later
    with contextlib.suppress(queue.Empty):
        while True:
            assert sock.next_event(timeout=0.3)["data"].get("queue") != "a"
    sock.incoming.put(None)
    thread.join(2)


class Records(list):  # type: ignore[type-arg]
    """A request's records that a weak reference can watch."""


def watched_hub(notes: list[str], clock: Any, max_events_per_s: int = 1000) -> Hub:
    """A hub publishing for another worker's dashboard that flushes only when told."""
    hub = Hub(FakeStore(), "w1", max_events_per_s=max_events_per_s,  # type: ignore[arg-type]
              relay_note=notes.append, clock=clock, flush_interval_s=3600)
    hub.receive(relay.presence("w2"))
    assert hub.listening
    return hub


def pushes(queue_name: str, prefix: str, n: int) -> tuple[list[dict[str, Any]], Records]:
    items = [{"queue": queue_name, "partition": "p"} for _ in range(n)]
    return items, Records(PushResult(j + 1, None, f"{prefix}-{j}", "queued") for j in range(n))


def test_past_the_sample_a_request_leaves_its_counts_and_no_records():
    notes: list[str] = []
    hub = watched_hub(notes, clock=lambda: 1000.0)
    refs = []
    for i in range(40):
        items, results = pushes("a", f"r{i}", 10)
        refs.append(weakref.ref(results))
        hub.publish(formats.PUSHED, items, results)
    del items, results
    kept = [ref for ref in refs if ref() is not None]
    assert len(kept) == math.ceil(SAMPLE_EVENTS / 10)  # the sample's; the others are gone
    hub._flush()
    batch = relay.decode(notes[-1])
    assert isinstance(batch, relay.Batch)
    assert batch.counts == {"a": {"message.pushed": 400}}
    assert batch.dropped == 400 - len(batch.events) and batch.events
    assert batch.events[0][0].data["transactionId"] == "r0-0"  # in order of publication
    assert not any(ref() for ref in refs)  # the flush let go of the sample too
    hub.shutdown()


def test_counts_stay_right_when_the_budget_bites():
    notes: list[str] = []
    now = [1000.0]
    hub = watched_hub(notes, clock=lambda: now[0], max_events_per_s=25)
    for i in range(4):
        hub.publish(formats.PUSHED, *pushes("a", f"r{i}", 10))  # 25 listed, then counted only
    hub.publish(formats.PROCESSING, [popped(f"b{i}", "b") for i in range(30)])
    acks = [{"transactionId": f"c{i}", "status": "completed"} for i in range(20)]
    results = [AckResult(i + 1, f"c{i}", "completed" if i % 4 else "dead_letter", None, NOW)
               for i in range(20)]
    hub.publish(formats.ACKED, acks, results)
    hub._flush()
    batch = relay.decode(notes[-1])
    assert isinstance(batch, relay.Batch)
    assert [e.data["transactionId"] for e, _ in batch.events] == (
        [f"r0-{j}" for j in range(10)] + [f"r1-{j}" for j in range(10)]
        + [f"r2-{j}" for j in range(5)])
    assert batch.counts == {"a": {"message.pushed": 40}, "b": {"message.processing": 30},
                            "": {"message.completed": 15, "message.failed": 5}}
    assert batch.dropped == 40 + 30 + 20 - 25

    hub._flush()
    assert len(notes) == 1  # nothing published, nothing sent
    now[0] += 1.0  # a new second: the budget is back
    hub.publish(formats.ACKED, acks[:2], results[:2])
    hub._flush()
    batch = relay.decode(notes[-1])
    assert isinstance(batch, relay.Batch)
    assert [(e.name, e.queue) for e, _ in batch.events] == [
        ("message.failed", "q"), ("message.completed", "q")]  # sampled acks are located
    assert batch.counts == {"q": {"message.failed": 1, "message.completed": 1}}
    assert batch.dropped == 0
    hub.shutdown()
