"""Every dashboard socket, on every worker of every host, gets every worker's message events."""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import websocket

from tests.conftest import Server
from tests.e2e.test_long_poll import servers

# Depth and stats snapshots rarely; events flushed often, so that no flush holds more events
# than one notification can list (its payload stops short of 8000 bytes and the rest are
# only counted): in a 1 s flush, one worker may see most of the test's 60 events.
QUIET = {
    "QUEEN_DASHBOARD_DEPTH_INTERVAL": "60",
    "QUEEN_DASHBOARD_STATS_INTERVAL": "60",
    "QUEEN_DASHBOARD_FLUSH_INTERVAL": "0.1",
}


def fresh(method: str, url: str, **kwargs: Any) -> requests.Response:
    """One request on a new connection, so the kernel may hand it to any worker."""
    headers = {"Connection": "close"}
    return requests.request(method, url, headers=headers, timeout=10, **kwargs)


class Watcher:
    """One dashboard socket and every event it received."""

    def __init__(self, host: Server) -> None:
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{host.port}/ws/dashboard", timeout=5)
        self.worker = json.loads(self.ws.recv())["data"]["workerId"]
        self.events: list[dict[str, Any]] = []

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.ws.settimeout(left)
            try:
                frame = self.ws.recv()
            except websocket.WebSocketTimeoutException:
                return
            if frame != "pong":
                self.events.append(json.loads(frame))

    def ids(self, name: str, queue: str) -> list[str]:
        return [e["data"]["transactionId"] for e in self.events
                if e["event"] == name and e["data"].get("queue") == queue]

    def summarised_workers(self) -> set[str]:
        return {e["data"]["workerId"] for e in self.events if e["event"] == "events.summary"}


def one_socket_per_worker(hosts: tuple[Server, ...], workers: int) -> Iterator[Watcher]:
    """Open sockets until every worker of every host holds one; close the spare ones."""
    for host in hosts:
        kept: dict[str, Watcher] = {}
        for _ in range(60):
            watcher = Watcher(host)
            if watcher.worker in kept:
                watcher.ws.close()
            else:
                kept[watcher.worker] = watcher
            if len(kept) == workers:
                break
            time.sleep(0.05)
        assert len(kept) == workers, f"sockets reached only {sorted(kept)}"
        yield from kept.values()


def until_every_worker_is_heard(hosts: tuple[Server, ...], watchers: list[Watcher]) -> None:
    """Push probes through fresh connections until each socket has had a batch of every worker."""
    everyone = {w.worker for w in watchers}
    deadline = time.monotonic() + 30
    round_ = 0
    while time.monotonic() < deadline:
        for host in hosts:
            for _ in range(4):
                round_ += 1
                item = {"queue": "probe", "payload": round_}
                assert fresh("POST", f"{host.url}/api/v1/push", json={"items": [item]}).ok
        for watcher in watchers:
            watcher.drain(0.3)
        if all(w.summarised_workers() >= everyone for w in watchers):
            return
    missing = {w.worker: everyone - w.summarised_workers() for w in watchers}
    raise AssertionError(f"batches never arrived: {missing}")


EVENT_KINDS = ("message.pushed", "message.processing", "message.completed")


def until_seen(watchers: list[Watcher], kinds: tuple[str, ...], ids: list[str]) -> None:
    """Drain the sockets until each has had the events of kinds for ids (15 s at most).

    The test waits for its events before it makes more, so that no worker's flush holds
    more than one notification can list, however late a loaded machine runs the flush:
    the rest of a full flush is only counted (the design), which this test would take
    for lost events.
    """
    deadline = time.monotonic() + 15
    for watcher in watchers:
        while time.monotonic() < deadline and not all(
            set(ids) <= set(watcher.ids(kind, "everywhere")) for kind in kinds
        ):
            watcher.drain(0.1)


@pytest.mark.parametrize("hosts_count", [1, 2], ids=["1-host-x-2-workers", "2-hosts-x-2-workers"])
def test_every_socket_gets_every_event_once(db_dsn, hosts_count):
    hosts = tuple(Server(db_dsn, workers=2, **QUIET) for _ in range(hosts_count))
    with servers(*hosts), contextlib.ExitStack() as stack:
        watchers = list(one_socket_per_worker(hosts, 2))
        for w in watchers:
            stack.callback(w.ws.close)
        until_every_worker_is_heard(hosts, watchers)

        pushed = []
        for i in range(20):
            host = hosts[i % len(hosts)]
            item = {"queue": "everywhere", "partition": f"p{i % 4}", "payload": i}
            resp = fresh("POST", f"{host.url}/api/v1/push", json={"items": [item]})
            pushed.append(resp.json()["messages"][0]["transactionId"])
            if len(pushed) % 5 == 0:
                until_seen(watchers, ("message.pushed",), pushed[-5:])
        popped: list[str] = []
        deadline = time.monotonic() + 30
        while len(popped) < 20 and time.monotonic() < deadline:
            host = hosts[len(popped) % len(hosts)]
            resp = fresh("GET", f"{host.url}/api/v1/pop/queue/everywhere?batch=3")
            if resp.status_code == 200:
                messages = resp.json()["messages"]
                acks = [{"transactionId": m["transactionId"], "status": "completed"}
                        for m in messages]
                ack = fresh("POST", f"{host.url}/api/v1/ack/batch", json={"acknowledgments": acks})
                assert ack.status_code == 200
                popped += [m["transactionId"] for m in messages]
                until_seen(watchers, EVENT_KINDS[1:], [a["transactionId"] for a in acks])
        assert sorted(popped) == sorted(pushed)

        for watcher in watchers:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                watcher.drain(0.3)
                if all(len(watcher.ids(k, "everywhere")) >= 20 for k in EVENT_KINDS):
                    break  # (each kind may come from another worker, later than the rest)
            watcher.drain(0.6)  # anything duplicated would arrive now
            for name in EVENT_KINDS:
                got = watcher.ids(name, "everywhere")
                assert sorted(got) == sorted(pushed), (watcher.worker, name, len(got))
            handlers = collections.Counter(
                e["data"]["workerId"] for e in watcher.events
                if e["event"] == "message.processing" and e["data"]["queue"] == "everywhere")
            # (Which worker accepts a connection is the kernel's choice: all of the pops
            # may land on one. That events of every worker reach every socket is what
            # until_every_worker_is_heard established.)
            assert sum(handlers.values()) == 20
