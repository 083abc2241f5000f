"""The workers of the cluster, as each describes itself in a node note.

Every worker sends a node note on the dashboard channel every NOTE_INTERVAL_S (its host,
pid, server, memory, pool and dashboard sockets); every worker's listener receives every
note, so whichever worker answers GET /api/v1/system/nodes knows every live worker of
every host, and how many servers share the database (their turns: queen.server.turns).
A worker silent for NOTE_TTL_S has stopped and is left out.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from queen.dashboard.formats import now_iso
from queen.server.turns import server_id

NOTE_INTERVAL_S = 5.0  # seconds between node notes of one worker (each costs a NOTIFY)
NOTE_TTL_S = 3 * NOTE_INTERVAL_S  # a worker not heard from this long is gone
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int | None:
    """Return this process's resident memory (None where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def encode(worker_id: str, info: dict[str, Any]) -> str:
    """Encode one node note (the payload of one NOTIFY)."""
    return orjson.dumps({"type": "node", "worker": worker_id, "info": info}).decode()


class Nodes:
    """The latest note of every worker heard from, and this worker's own notes."""

    def __init__(
        self,
        worker_id: str,
        describe: Callable[[], dict[str, Any]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """describe returns what this worker reports beyond host, pid and memory."""
        self.worker_id = worker_id
        self.describe = describe
        self.clock = clock
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.server = server_id()
        self.started_at = now_iso()
        self._seen: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def note(self) -> str:
        """Return this worker's note now."""
        info = {
            "host": self.host,
            "pid": self.pid,
            "server": self.server,
            "startedAt": self.started_at,
            "rssBytes": rss_bytes(),
            **self.describe(),
        }
        return encode(self.worker_id, info)

    def receive(self, doc: dict[str, Any]) -> None:
        """Keep a decoded note (type "node") as its worker's latest."""
        info = doc.get("info")
        if isinstance(info, dict):
            info = {**info, "seenAt": now_iso()}
            with self._lock:
                self._seen[str(doc.get("worker", ""))] = (self.clock(), info)

    def workers(self) -> list[dict[str, Any]]:
        """Return the live workers' latest notes, by host then worker id."""
        cutoff = self.clock() - NOTE_TTL_S
        with self._lock:
            for worker in [w for w, (at, _) in self._seen.items() if at < cutoff]:
                del self._seen[worker]
            seen = sorted(self._seen.items())
        found = [{"workerId": worker, **info} for worker, (_, info) in seen]
        return sorted(found, key=lambda w: (str(w.get("host")), w["workerId"]))

    def servers(self) -> int:
        """Return how many servers the live workers belong to, this worker's own always
        among them (its own notes may not have come back yet); a worker of a build whose
        notes name none counts as its host's."""
        return len({self.server} | {w.get("server") or w.get("host") for w in self.workers()})

    def run(self, send: Callable[[str], None], stopping: threading.Event) -> None:
        """Send a note every NOTE_INTERVAL_S until stopping is set."""
        while not stopping.is_set():
            send(self.note())
            stopping.wait(NOTE_INTERVAL_S)
