"""The per-process dashboard hub: connected sockets, cluster-wide events and snapshots.

Publishing costs one boolean check while no dashboard is open anywhere in the cluster.
While one is (a socket here, or a fresh presence note from another worker), a request
either hands its records to the inbox, while this flush's sample (SAMPLE_EVENTS, within
the per-second budget) has room, or adds its counts per queue and kind and keeps nothing:
records held until the flush would survive young garbage collections and cost every
request full ones (more than the relay itself). No database work on the request path. A
relay greenlet drains the inbox every flush_interval_s, formats the sampled events
(locating acknowledged messages with one query per flush) and sends them with the counts
as one NOTIFY (queen.dashboard.relay). Every worker's listener hands those batches, its own
included, to `receive`, which builds each event's WebSocket frame once and queues it in
the bounded outbox of every client that wants it; each client's own writer drains its
outbox, all it finds in one write. So every socket gets every worker's events, once.
A second greenlet takes one depth snapshot per period for the clients of the process.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import orjson

from queen.config import Settings
from queen.dashboard import formats, relay
from queen.dashboard.client import DashboardClient, Socket, text_frame
from queen.dashboard.formats import Event
from queen.dashboard.nodes import Nodes
from queen.dashboard.ticker import Ticker
from queen.errors import QueenError
from queen.store.dashboard import Dashboard, MessagePlace

log = logging.getLogger(__name__)

SAMPLE_EVENTS = 128  # events kept per flush: more than one notification lists (75+ bytes each)
PARTITION_DEPTH = "partition.depth"
LOCATE_LIMIT = 64  # acknowledgments located per flush: about what one notification lists
MAX_CLIENT_MESSAGE = 64 * 1024  # bytes; longer client messages are refused
NODE_NOTE = '{"type":"node"'  # how every node note begins (queen.dashboard.nodes.encode)


class Publisher(Protocol):
    """What the API calls, once per request."""

    def publish(self, kind: str, *records: Sequence[Any]) -> None: ...


class Silent:
    """The publisher of an app without dashboards."""

    def publish(self, kind: str, *records: Sequence[Any]) -> None:
        return None


SILENT = Silent()
# (kind, records, time.time(), events of it the sample may list)
Publication = tuple[str, tuple[Sequence[Any], ...], float, int]


class RateBudget:
    """Allow at most per_second per-message events; the rest are counted as dropped."""

    def __init__(self, per_second: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.clock = clock
        self._window = float("-inf")
        self._used = 0

    def take(self, wanted: int) -> int:
        """Grant up to `wanted` events from this second's allowance; return how many."""
        now = self.clock()
        if now - self._window >= 1.0:
            self._window, self._used = now, 0
        granted = max(0, min(wanted, self.per_second - self._used))
        self._used += granted
        return granted


class Hub:
    """Dashboards connected to this process, and the events they receive."""

    def __init__(
        self,
        store: Dashboard | None,
        worker_id: str,
        *,
        depth_interval_s: float = 5.0,
        stats_interval_s: float = 10.0,
        client_buffer: int = 1000,
        max_events_per_s: int = 1000,
        relay_note: Callable[[str], None] | None = None,
        flush_interval_s: float = relay.FLUSH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """relay_note sends a dashboard notification to every worker (None: to this hub only)."""
        self.store = store
        self.worker_id = worker_id
        self.depth_interval_s = depth_interval_s
        self.stats_interval_s = stats_interval_s
        self.client_buffer = client_buffer
        self.relay_note = relay_note
        self.flush_interval_s = flush_interval_s
        self.clock = clock
        self.listening = False  # the one check publishers pay while nobody watches
        self.dropped_events = 0  # cluster-wide, as reported by the batches received
        self._clients: tuple[DashboardClient, ...] = ()
        self._lock = threading.Lock()
        self._pending = threading.Lock()  # the inbox, counts and room between requests and flush
        self._inbox: list[Publication] = []  # the publications this flush's sample comes from
        self._room = SAMPLE_EVENTS  # events the inbox may still take before the next flush
        self._counts: relay.Counts = {}  # events of publications not in the inbox
        self._watched_until = float("-inf")  # another worker's presence note keeps us publishing
        self._watched = threading.Event()  # set while listening: the relay loop runs
        self._announce_now = True
        self._has_clients = threading.Event()
        self._stopping = threading.Event()
        self._started = False
        self._budget = RateBudget(max_events_per_s, clock)
        self._ticker = Ticker(store) if store is not None else None
        self.nodes = Nodes(worker_id, self._describe)

    @classmethod
    def from_settings(cls, settings: Settings, store: Dashboard | None) -> Hub:
        return cls(
            store,
            settings.effective_worker_id,
            depth_interval_s=settings.dashboard_depth_interval_s,
            stats_interval_s=settings.dashboard_stats_interval_s,
            client_buffer=settings.dashboard_client_buffer,
            max_events_per_s=settings.dashboard_max_events_per_s,
            flush_interval_s=settings.dashboard_flush_interval_s,
        )

    def start_relay(self, relay_note: Callable[[str], None]) -> None:
        """Send notifications through relay_note (a NOTIFY every worker receives).

        From then on this worker also announces itself with a node note (queen.dashboard.nodes).
        """
        self.relay_note = relay_note
        threading.Thread(
            target=self.nodes.run,
            args=(self._send_node, self._stopping),
            name="dashboard-nodes",
            daemon=True,
        ).start()

    def _describe(self) -> dict[str, Any]:
        pool = None
        if self.store is not None:
            try:
                pool = self.store.pool()
            except QueenError:
                pool = None
        return {"dashboardSockets": self.connections, "pool": pool}

    def _send_node(self, payload: str) -> None:
        send = self.relay_note
        try:
            if send is not None:
                send(payload)
        except QueenError as exc:
            log.warning("dashboard: cannot send this worker's node note: %s", exc.message)

    def workers(self) -> list[dict[str, Any]]:
        """Return every live worker's latest node note (without a relay: this worker's own)."""
        if self.relay_note is None:
            self.nodes.receive(orjson.loads(self.nodes.note()))
        return self.nodes.workers()

    @property
    def connections(self) -> int:
        return len(self._clients)

    def publish(self, kind: str, *records: Sequence[Any]) -> None:
        """Hand one request's records to the relay, or only their counts once the sample is full.

        Nothing happens while nobody watches.
        """
        if not self.listening:
            return
        with self._pending:
            if self._room > 0:
                allowed = self._budget.take(min(len(records[-1]), self._room))
                if allowed:
                    self._room -= allowed
                    self._inbox.append((kind, records, time.time(), allowed))
                    return  # formatted and counted by the relay, off the request
            formats.tally(self._counts, kind, records, {}, relay.OTHER)

    def _take_pending(self) -> tuple[list[Publication], relay.Counts]:
        """Return and forget what was published since the last flush."""
        with self._pending:
            inbox, counts = self._inbox, self._counts
            self._inbox, self._counts, self._room = [], {}, SAMPLE_EVENTS
        return inbox, counts

    # -- connections ---------------------------------------------------------------

    def serve(self, ws: Socket) -> None:
        """Run one dashboard connection until the peer goes away (blocks this greenlet)."""
        client = DashboardClient(ws, self.client_buffer)
        connected = {"connectionId": client.id, "version": "v2", "workerId": self.worker_id}
        client.send(formats.encode("connected", connected, formats.now_iso()))
        self._replay(client)
        client.start_writer()
        self._add(client)
        try:
            self._read(client)
        finally:
            self._remove(client)
            client.close()

    def _read(self, client: DashboardClient) -> None:
        while not client.closed:
            try:
                message = client.ws.receive()
            except Exception as exc:  # noqa: BLE001 - any socket failure ends the connection
                log.debug("dashboard %s: receive failed (%r)", client.id, exc)
                return
            if message is None:
                return
            if isinstance(message, bytes):
                message = message.decode("utf-8", "replace")
            self._handle(client, message)

    def _handle(self, client: DashboardClient, message: str) -> None:
        """Answer ping with pong; apply subscribe / unsubscribe; report anything else."""
        if message.strip() == "ping":
            client.send("pong")
            return
        try:
            doc = orjson.loads(message) if len(message) <= MAX_CLIENT_MESSAGE else None
        except orjson.JSONDecodeError:
            doc = None
        kind = doc.get("type") if isinstance(doc, dict) else None
        if kind == "ping":
            client.send("pong")
        elif kind == "subscribe" and isinstance(doc, dict):
            queues = doc.get("queues")
            names = [q for q in queues if isinstance(q, str)] if isinstance(queues, list) else []
            client.queues = frozenset(names) if names else None
            client.batched = doc.get("batch") is True
            answer: dict[str, Any] = {"queues": sorted(names)}
            if client.batched:
                answer["batch"] = True
            self._send(client, "subscribed", answer)
            self._replay(client)  # the snapshot may have reached it before the subscription
        elif kind == "unsubscribe":
            client.queues = None
            self._send(client, "subscribed", {"queues": []})
        else:
            error = 'expected \'ping\' or {"type": "subscribe", "queues": [...], "batch": bool}'
            self._send(client, "error", {"error": error})

    def _send(self, client: DashboardClient, name: str, data: dict[str, Any]) -> None:
        client.send(formats.encode(name, data, formats.now_iso()))

    def _replay(self, client: DashboardClient) -> None:
        """Give a newcomer (or a new subscription) the latest queue depths it wants, instead
        of a blank screen until the next tick: a snapshot taken as it connected may have gone
        out before its subscription arrived, or been pushed out of its outbox by the
        partition depths it did not yet say it does not want."""
        if self._ticker is None:
            return
        events, timestamp = self._ticker.replay(max_age_s=2 * self.depth_interval_s)
        for event in events:
            if client.wants(event.queue):
                client.send(formats.encode(event.name, event.data, timestamp))

    def _add(self, client: DashboardClient) -> None:
        with self._lock:
            self._clients = (*self._clients, client)
            self._announce_now = True
            self._has_clients.set()
            self._watch()
        self._fan_out([Event("client.connected", {"clientId": client.id}, None)])

    def _remove(self, client: DashboardClient) -> None:
        with self._lock:
            self._clients = tuple(c for c in self._clients if c is not client)
            if not self._clients:
                self._has_clients.clear()
                self._still_watched()
        self._fan_out([Event("client.disconnected", {"clientId": client.id}, None)])

    def shutdown(self) -> None:
        """Close every dashboard connection and stop the loops (the worker is exiting)."""
        self._stopping.set()
        self._has_clients.set()
        self._watched.set()
        for client in self._clients:
            client.close()

    # -- fan-out -------------------------------------------------------------------

    def _fan_out(
        self,
        events: Iterable[Event],
        timestamp: str | None = None,
        clients: Sequence[DashboardClient] | None = None,
    ) -> None:
        """Copy each event to the outbox of every client whose subscription wants it."""
        stamp = timestamp or formats.now_iso()
        self._deliver(((event, stamp) for event in events), clients)

    def _deliver(
        self,
        stamped: Iterable[tuple[Event, str]],
        clients: Sequence[DashboardClient] | None = None,
    ) -> None:
        """Queue each (event, timestamp) as a frame, built once, for every client wanting it.

        Batched clients (the page) get no partition.depth: queue.depth carries the same
        counts, and a thousand partitions would fill their outbox every snapshot.
        """
        targets = self._clients if clients is None else clients
        for event, timestamp in stamped:
            frame = None
            per_partition = event.name == PARTITION_DEPTH
            for client in targets:
                if client.wants(event.queue) and not (per_partition and client.batched):
                    if frame is None:
                        frame = text_frame(formats.encode_json(event.name, event.data, timestamp))
                    client.send_frame(frame)

    def _start_loops(self) -> None:
        threading.Thread(target=self._relay_loop, name="dashboard-relay", daemon=True).start()
        if self._ticker is not None:
            threading.Thread(target=self._tick_loop, name="dashboard-ticker", daemon=True).start()

    # -- cluster relay ---------------------------------------------------------------

    def _watch(self) -> None:
        """Start publishing: a dashboard is open here or elsewhere (the caller holds the lock)."""
        self.listening = True
        self._watched.set()
        if not self._started:
            self._started = True
            self._start_loops()

    def _still_watched(self) -> bool:
        """Stop publishing once no socket is open here and no presence note is fresh."""
        if self._clients or self.clock() < self._watched_until:
            return True
        self.listening = False
        self._watched.clear()
        return False

    def receive(self, payload: str) -> None:
        """Take one dashboard notification (from the listener): a node or presence note, or a batch."""
        if payload.startswith(NODE_NOTE):
            try:
                self.nodes.receive(orjson.loads(payload))
            except orjson.JSONDecodeError:
                log.debug("dashboard: ignoring node note %.80r", payload)
            return
        note = relay.decode(payload)
        if note is None:
            log.debug("dashboard: ignoring notification %.80r", payload)
        elif isinstance(note, str):
            if note != self.worker_id:  # our own sockets are known without notes
                with self._lock:
                    self._watched_until = self.clock() + relay.PRESENCE_TTL_S
                    self._watch()
        else:
            self.dropped_events += note.dropped
            self._forward(note)

    def _forward(self, batch: relay.Batch) -> None:
        """Copy a batch to every client: per event, or as one events.batch frame if asked.

        Each event's frame is built once for every per-event client; each client's writer
        then writes the frames it finds queued in one go.
        """
        clients = self._clients
        single = [c for c in clients if not c.batched]
        if single:
            self._deliver(batch.events, single)
            self._fan_out([Event("events.summary", relay.summary(batch), None)], None, single)
        frames: dict[frozenset[str] | None, bytes] = {}  # one encoding per subscription
        for client in clients:
            if client.batched:
                frame = frames.get(client.queues)
                if frame is None:
                    frame = frames[client.queues] = text_frame(
                        relay.batch_frame(batch, client.wants)
                    )
                client.send_frame(frame)

    def _note(self, payload: str) -> None:
        send = self.relay_note
        if send is None:
            self.receive(payload)
            return
        try:
            send(payload)
        except QueenError as exc:
            log.warning("dashboard: cannot send events: %s", exc.message)

    def _relay_loop(self) -> None:
        next_presence = 0.0
        while not self._stopping.is_set():
            with self._lock:
                watched = self._still_watched()
            if not watched:
                self._take_pending()
                self._watched.wait()
                continue
            now = self.clock()
            if self._clients and (self._announce_now or now >= next_presence):
                self._announce_now = False
                next_presence = now + relay.PRESENCE_INTERVAL_S
                self._note(relay.presence(self.worker_id))
            self._stopping.wait(self.flush_interval_s)
            self._flush()

    def _flush(self) -> None:
        """Send the inbox's events and every publication's counts as one batch."""
        inbox, counts = self._take_pending()
        if not inbox and not counts:
            return
        ids = [i for kind, recs, _, n in inbox for i in formats.acked_ids(kind, recs)[:n]]
        places = self._locate(ids[:LOCATE_LIMIT])
        for kind, records, _, _ in inbox:
            formats.tally(counts, kind, records, places, relay.OTHER)
        total = sum(n for by_name in counts.values() for n in by_name.values())
        sample = self._sample(inbox, places)  # lazy: built only as far as the payload holds
        self._note(relay.encode_batch(self.worker_id, sample, counts, total))

    def _sample(
        self, inbox: list[Publication], places: dict[str, MessagePlace]
    ) -> Iterator[tuple[Event, str]]:
        for kind, records, at, allowed in inbox:
            timestamp = formats.iso_of(at)
            events = formats.expand(kind, records, places, self.worker_id)
            for event in itertools.islice(events, allowed):
                yield event, timestamp

    def _locate(self, transaction_ids: list[str]) -> dict[str, MessagePlace]:
        if not transaction_ids or self.store is None:
            return {}
        try:
            return self.store.locate(transaction_ids)
        except QueenError as exc:
            log.warning("dashboard: cannot locate acknowledged messages: %s", exc.message)
            return {}

    def _tick_loop(self) -> None:
        assert self._ticker is not None
        next_depth = next_stats = 0.0
        while not self._stopping.is_set():
            if not self._has_clients.is_set():
                self._ticker.reset()
                self._has_clients.wait()
                next_depth = next_stats = 0.0  # fresh numbers for whoever just connected
                continue
            now = time.monotonic()
            if now >= next_depth:
                next_depth = now + self.depth_interval_s
                self._fan_out(self._ticker.depth_events())
            if now >= next_stats:
                next_stats = now + self.stats_interval_s
                stats = self._ticker.stats_event(self.connections, self.dropped_events)
                self._fan_out([stats] if stats else [])
            self._stopping.wait(max(0.0, min(next_depth, next_stats) - time.monotonic()))
