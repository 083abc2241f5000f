"""The per-process dashboard hub: connected sockets, event fan-out and periodic snapshots.

Publishing costs one boolean check while no dashboard is connected to this process.
With dashboards connected, the API appends one record per request to an inbox; a
dispatcher greenlet formats the events (locating acknowledged messages with one
query per batch) and copies each frame to the clients' bounded outboxes, which each
client's own writer drains. A second greenlet takes one depth snapshot per period
for all clients of the process.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import orjson

from queen.config import Settings
from queen.dashboard import formats
from queen.dashboard.client import DashboardClient, Socket
from queen.dashboard.formats import Event
from queen.dashboard.ticker import Ticker
from queen.errors import QueenError
from queen.store.dashboard import Dashboard, MessagePlace

log = logging.getLogger(__name__)

INBOX_LIMIT = 1000  # publications (requests) waiting for the dispatcher; oldest dropped
DISPATCH_BATCH = 50  # publications formatted per round (one lookup query for their acks)
MAX_CLIENT_MESSAGE = 64 * 1024  # bytes; longer client messages are refused


class Publisher(Protocol):
    """What the API calls, once per request."""

    def publish(self, kind: str, *records: Sequence[Any]) -> None: ...


class Silent:
    """The publisher of an app without dashboards."""

    def publish(self, kind: str, *records: Sequence[Any]) -> None:
        return None


SILENT = Silent()


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
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.depth_interval_s = depth_interval_s
        self.stats_interval_s = stats_interval_s
        self.client_buffer = client_buffer
        self.listening = False  # the one check publishers pay while nobody watches
        self.dropped_events = 0
        self._clients: tuple[DashboardClient, ...] = ()
        self._lock = threading.Lock()
        self._inbox: deque[tuple[str, tuple[Sequence[Any], ...], str]] = deque(maxlen=INBOX_LIMIT)
        self._inbox_ready = threading.Event()
        self._has_clients = threading.Event()
        self._stopping = threading.Event()
        self._started = False
        self._budget = RateBudget(max_events_per_s)
        self._ticker = Ticker(store) if store is not None else None

    @classmethod
    def from_settings(cls, settings: Settings, store: Dashboard | None) -> Hub:
        return cls(
            store,
            settings.effective_worker_id,
            depth_interval_s=settings.dashboard_depth_interval_s,
            stats_interval_s=settings.dashboard_stats_interval_s,
            client_buffer=settings.dashboard_client_buffer,
            max_events_per_s=settings.dashboard_max_events_per_s,
        )

    @property
    def connections(self) -> int:
        return len(self._clients)

    def publish(self, kind: str, *records: Sequence[Any]) -> None:
        """Hand one request's records to the dispatcher (nothing happens while nobody watches)."""
        if not self.listening:
            return
        self._inbox.append((kind, records, formats.now_iso()))
        self._inbox_ready.set()

    # -- connections ---------------------------------------------------------------

    def serve(self, ws: Socket) -> None:
        """Run one dashboard connection until the peer goes away (blocks this greenlet)."""
        client = DashboardClient(ws, self.client_buffer)
        connected = {"connectionId": client.id, "version": "v2"}
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
            self._send(client, "subscribed", {"queues": sorted(names)})
        elif kind == "unsubscribe":
            client.queues = None
            self._send(client, "subscribed", {"queues": []})
        else:
            error = 'expected \'ping\' or {"type": "subscribe", "queues": [...]}'
            self._send(client, "error", {"error": error})

    def _send(self, client: DashboardClient, name: str, data: dict[str, Any]) -> None:
        client.send(formats.encode(name, data, formats.now_iso()))

    def _replay(self, client: DashboardClient) -> None:
        """Give a newcomer the latest queue depths instead of a blank screen until the next tick."""
        if self._ticker is None:
            return
        events, timestamp = self._ticker.replay(max_age_s=2 * self.depth_interval_s)
        for event in events:
            client.send(formats.encode(event.name, event.data, timestamp))

    def _add(self, client: DashboardClient) -> None:
        with self._lock:
            self._clients = (*self._clients, client)
            self.listening = True
            self._has_clients.set()
            if not self._started:
                self._started = True
                self._start_loops()
        self._fan_out([Event("client.connected", {"clientId": client.id}, None)])

    def _remove(self, client: DashboardClient) -> None:
        with self._lock:
            self._clients = tuple(c for c in self._clients if c is not client)
            if not self._clients:
                self.listening = False
                self._has_clients.clear()
        self._fan_out([Event("client.disconnected", {"clientId": client.id}, None)])

    def shutdown(self) -> None:
        """Close every dashboard connection and stop the loops (the worker is exiting)."""
        self._stopping.set()
        self._has_clients.set()
        self._inbox_ready.set()
        for client in self._clients:
            client.close()

    # -- fan-out -------------------------------------------------------------------

    def _fan_out(self, events: Iterable[Event], timestamp: str | None = None) -> None:
        """Copy each event to the outbox of every client whose subscription wants it."""
        for event in events:
            text = None
            for client in self._clients:
                if client.wants(event.queue):
                    if text is None:
                        text = formats.encode(
                            event.name, event.data, timestamp or formats.now_iso()
                        )
                    client.send(text)

    def _start_loops(self) -> None:
        threading.Thread(target=self._dispatch_loop, name="dashboard-dispatch", daemon=True).start()
        if self._ticker is not None:
            threading.Thread(target=self._tick_loop, name="dashboard-ticker", daemon=True).start()

    def _dispatch_loop(self) -> None:
        while not self._stopping.is_set():
            self._inbox_ready.wait()
            self._inbox_ready.clear()
            while self._inbox and not self._stopping.is_set():
                count = min(len(self._inbox), DISPATCH_BATCH)
                self._dispatch([self._inbox.popleft() for _ in range(count)])
                time.sleep(0)  # let request greenlets run between rounds

    def _dispatch(self, batch: list[tuple[str, tuple[Sequence[Any], ...], str]]) -> None:
        """Format and fan out a round of publications, within the per-second event budget."""
        granted = []
        for kind, records, timestamp in batch:
            wanted = len(records[-1])  # one event per result or message, at most
            allowed = self._budget.take(wanted)
            self.dropped_events += wanted - allowed
            if allowed:
                granted.append((kind, records, timestamp, allowed))
        ids = [i for kind, recs, _, n in granted for i in formats.acked_ids(kind, recs)[:n]]
        places = self._locate(ids)
        for kind, records, timestamp, allowed in granted:
            events = formats.expand(kind, records, places, self.worker_id)
            self._fan_out(itertools.islice(events, allowed), timestamp)

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
