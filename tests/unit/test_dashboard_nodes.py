"""Node notes: what a worker says of itself, and which workers count as live."""

from __future__ import annotations

import os

import orjson

from queen.dashboard.hub import Hub
from queen.dashboard.nodes import NOTE_TTL_S, Nodes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_note_names_host_pid_memory_and_what_the_worker_adds():
    doc = orjson.loads(Nodes("w1", lambda: {"dashboardSockets": 2}).note())
    assert doc["type"] == "node" and doc["worker"] == "w1"
    info = doc["info"]
    assert info["pid"] > 0 and info["host"] and info["rssBytes"] > 0
    assert info["server"] == f"{info['host']}:{os.getppid()}"  # (its master's)
    assert info["dashboardSockets"] == 2


def test_workers_not_heard_from_within_the_ttl_are_left_out():
    clock = Clock()
    nodes = Nodes("w1", dict, clock)
    nodes.receive({"type": "node", "worker": "b", "info": {"host": "h2"}})
    nodes.receive({"type": "node", "worker": "a", "info": {"host": "h1"}})
    assert [w["workerId"] for w in nodes.workers()] == ["a", "b"]  # by host
    clock.now += NOTE_TTL_S / 2
    nodes.receive({"type": "node", "worker": "b", "info": {"host": "h2"}})
    clock.now += NOTE_TTL_S / 2 + 0.1
    assert [w["workerId"] for w in nodes.workers()] == ["b"]
    nodes.receive({"type": "node", "worker": "c", "info": "not a dict"})
    assert [w["workerId"] for w in nodes.workers()] == ["b"]


def test_servers_count_the_live_workers_masters():
    clock = Clock()
    nodes = Nodes("w1", dict, clock)
    nodes.server = "h1:10"
    assert nodes.servers() == 1  # its own, before any note came back
    nodes.receive({"type": "node", "worker": "c", "info": {"host": "h1", "server": "h1:20"}})
    assert nodes.servers() == 2  # another master on this host: another server
    for worker in ("w1", "b"):
        nodes.receive({"type": "node", "worker": worker, "info": {"host": "h1", "server": "h1:10"}})
    assert nodes.servers() == 2
    nodes.receive({"type": "node", "worker": "d", "info": {"host": "h2"}})  # (names none)
    assert nodes.servers() == 3
    clock.now += NOTE_TTL_S / 2
    nodes.receive({"type": "node", "worker": "b", "info": {"host": "h1", "server": "h1:10"}})
    clock.now += NOTE_TTL_S / 2 + 0.1
    assert nodes.servers() == 1  # the others went silent


def test_the_hub_keeps_node_notes_apart_from_events_and_ignores_broken_ones():
    hub = Hub(None, "self")
    hub.receive(orjson.dumps({"type": "node", "worker": "other", "info": {"host": "h"}}).decode())
    hub.receive('{"type":"node", broken')
    assert {w["workerId"] for w in hub.workers()} == {"other", "self"}  # no relay: itself too
    assert not hub.listening  # a node note is no sign of a dashboard
