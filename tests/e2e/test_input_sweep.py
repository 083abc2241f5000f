"""A seeded sweep of odd requests over every route of the OpenAPI document.

The endpoint tests name the bad inputs each route must refuse; this one throws a few
thousand more at a real gunicorn, made by a seeded generator: path segments, query
values and bodies that are junk, or valid ones with one field changed, reusing the
transaction and lease ids real pops returned. Whatever a request holds, the answer is
below 500, and every 4xx is a JSON error. Afterwards the server still pushes, pops and
acks. `QUEEN_SWEEP_SEED` and `QUEEN_SWEEP_REQUESTS` explore further than the default.
"""

from __future__ import annotations

import json
import os
import random
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from queen.models import QUEUE_OPTIONS
from tests.conftest import Server, cloned_database

SEED = int(os.environ.get("QUEEN_SWEEP_SEED", "20261203"))
REQUESTS = int(os.environ.get("QUEEN_SWEEP_REQUESTS", "1500"))
QUEUES = ["sweep-a", "sweep-b", "sweep-c"]

ODD = [
    "", "a", "Default", "x" * 300, "é", "\u0000", "%00", "..", "../etc", "a/b", " ", "-1",
    "0", "1", "99999999999999999999", "true", "null", "1e309", "NaN",
    "2026-13-45T25:61:61Z", "2026-12-01T00:00:00Z", "00000000-0000-0000-0000-000000000000",
    "01a23a8a-ab85-7000-8000-000000000000", "not-a-uuid", "%", "%ZZ", "a%2Fb", ";", "'",
    '"', "<script>", "\udcff",
]
WORDS = ["completed", "failed", "retry", "ack", "push", "beginning", "end", "all", "new"]
KEYS = [
    "items", "queue", "partition", "payload", "transactionId", "status", "error",
    "consumerGroup", "leaseId", "seconds", "operations", "type", "to", "options",
    "namespace", "task", "traceId", "encrypted", "acknowledgments", "x",
]
OPTIONS = [option.name for option in QUEUE_OPTIONS] + ["x"]  # and one no queue has
QUERY = [
    "batch", "wait", "timeout", "limit", "offset", "from", "to", "status", "queue",
    "consumerGroup", "subscriptionMode", "subscriptionFrom", "interval", "partition",
]
RAW_BODIES = [
    b"", b"{", b"[", b"null", b"\xff\xfe", b'{"a":1}{', b"1e999999", b'"x"',
    b'{"items": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
]


class Sweep:
    """The seeded generator, and the messages real pops returned (to ack and look up)."""

    def __init__(self, seed: int) -> None:
        self.rand = random.Random(seed)
        self.popped: list[dict[str, Any]] = []

    def junk(self, depth: int = 0) -> Any:
        r = self.rand
        kind = r.randrange(10 if depth < 3 else 6)
        if kind == 0:
            return None
        if kind == 1:
            return r.choice([True, False])
        if kind == 2:
            return r.choice([0, -1, 1, 2**31, 2**63, -(2**63), 10**30, 1.5, -0.0])
        if kind == 3:
            return r.choice(ODD)
        if kind == 4:
            return r.choice(WORDS)
        if kind == 5:
            return r.choice([{}, [], "", 0])
        if kind in (6, 7):
            return {r.choice(KEYS): self.junk(depth + 1) for _ in range(r.randrange(5))}
        return [self.junk(depth + 1) for _ in range(r.randrange(4))]

    def changed(self, doc: dict[str, Any]) -> dict[str, Any]:
        """doc, most times with one field (its own or another) set to junk."""
        doc = dict(doc)
        if self.rand.random() < 0.7:
            doc[self.rand.choice(list(doc) + KEYS)] = self.junk()
        return doc

    def message(self) -> dict[str, Any]:
        if self.popped:
            return self.rand.choice(self.popped)
        return {"transactionId": "t1", "leaseId": None}

    def body(self, path: str) -> bytes:
        if self.rand.random() < 0.6:
            return json.dumps(self.valid_body(path)).encode()
        if self.rand.random() < 0.3:
            return self.rand.choice(RAW_BODIES)
        return json.dumps(self.junk()).encode()

    def valid_body(self, path: str) -> Any:
        r, queue = self.rand, self.rand.choice(QUEUES)
        if path == "/api/v1/push":
            return {"items": [
                self.changed({
                    "queue": queue, "partition": r.choice(["p", "p2", "Default"]),
                    "payload": self.junk(), "transactionId": f"t{r.randrange(50)}",
                }) if r.random() < 0.5 else {"queue": queue, "payload": {"n": 1}}
                for _ in range(r.randrange(1, 5))
            ]}
        if path == "/api/v1/configure":
            options = self.changed({r.choice(OPTIONS): r.choice([0, 1, 5, 100, True])})
            return self.changed({"queue": queue, "partition": "p", "options": options})
        if path in ("/api/v1/ack", "/api/v1/ack/batch"):
            m = self.message()
            one = self.changed({
                "transactionId": m["transactionId"], "leaseId": m.get("leaseId"),
                "status": r.choice(["completed", "failed"]), "error": "e",
            })
            return {"acknowledgments": [one, self.changed(one)]} if path.endswith("batch") else one
        if path == "/api/v1/transaction":
            m = self.message()
            operations = [
                self.changed({
                    "type": "ack", "transactionId": m["transactionId"],
                    "leaseId": m.get("leaseId"), "status": "completed",
                }),
                self.changed({"type": "push", "items": [{"queue": queue, "payload": 1}]}),
            ]
            return {"operations": operations[: r.randrange(1, 3)]}
        if path.endswith("/seek"):
            to = r.choice(["beginning", "end", "2026-12-01T00:00:00Z", self.junk()])
            return self.changed({"queue": queue, "to": to})
        if path.endswith("/extend"):
            return self.changed({"seconds": r.choice([1, 30, 0, -1, 10**9])})
        return self.junk()

    def segment(self, name: str) -> str:
        r = self.rand
        if name == "leaseId" and self.popped and r.random() < 0.6:
            return str(self.message()["leaseId"])
        if name == "transactionId" and self.popped and r.random() < 0.6:
            return str(self.message()["transactionId"])
        return str(r.choice(QUEUES + ["g1", "p", "p2"] + ODD))

    def url(self, path: str, params: list[str]) -> str:
        r = self.rand
        while "{" in path:
            start, end = path.index("{"), path.index("}")
            value = quoted(self.segment(path[start + 1 : end]))
            path = path[:start] + value + path[end + 1 :]
        query = {p: str(self.junk()) for p in params if r.random() < 0.5}
        if r.random() < 0.2:
            query[r.choice(QUERY)] = r.choice(ODD)
        if "/pop" in path:
            query["timeout"] = str(r.choice([0, 1, 10]))  # long polls stay short
        text = "&".join(f"{quoted(k)}={quoted(v)}" for k, v in query.items())
        return path + ("?" + text if text else "")


def quoted(text: str) -> str:
    """text percent-encoded for a URL; a lone surrogate becomes a byte that is no UTF-8."""
    return urllib.parse.quote(text.encode("utf-8", "surrogateescape"), safe="")


def routes(spec: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """(method, path, query parameter names) of every HTTP operation of the document."""
    found = []
    for path, ops in spec["paths"].items():
        if path.startswith("/ws"):
            continue
        for method, op in ops.items():
            if method not in ("get", "post", "put", "delete"):
                continue
            params = op.get("parameters", []) + ops.get("parameters", [])
            names = [p["name"] for p in params if p.get("in") == "query"]
            found.append((method.upper(), path, names))
    return found


@pytest.fixture(scope="module")
def sweep_server(server_dsn: str, template_db: str) -> Iterator[Server]:
    with cloned_database(server_dsn, template_db, "queen_sweep") as dsn:
        srv = Server(dsn).start()
        yield srv
        srv.stop()


def test_odd_requests_to_every_route_get_json_4xx_and_never_5xx(sweep_server: Server) -> None:
    base, sweep = sweep_server.url, Sweep(SEED)
    failures: list[str] = []
    answered: dict[int, int] = {}
    with requests.Session() as http:
        table = routes(http.get(f"{base}/api/v1/openapi.json", timeout=10).json())
        assert len(table) >= 40  # every route the server documents
        seeded = [{"queue": q, "partition": "p", "payload": {"n": i}} for q in QUEUES for i in range(20)]
        assert http.post(f"{base}/api/v1/push", json={"items": seeded}, timeout=10).status_code == 201
        for _ in range(REQUESTS):
            method, path, params = sweep.rand.choice(table)
            url = sweep.url(path, params)
            body = sweep.body(path) if method != "GET" else None
            r = http.request(
                method, base + url, data=body, timeout=30,
                headers={"Content-Type": "application/json"} if body is not None else {},
            )
            answered[r.status_code] = answered.get(r.status_code, 0) + 1
            if r.status_code >= 500:
                failures.append(f"{method} {url} {body[:200]!r}: {r.status_code} {r.text[:200]}")
            elif r.status_code >= 400:
                if not r.headers.get("Content-Type", "").startswith("application/json"):
                    failures.append(f"{method} {url}: {r.status_code} is not JSON: {r.text[:200]}")
                elif not isinstance(r.json().get("error"), str):
                    failures.append(f"{method} {url}: {r.status_code} names no error: {r.text[:200]}")
            elif r.status_code == 200 and "/pop" in path:
                sweep.popped.extend(r.json()["messages"])
        assert not failures, "\n".join(failures[:20])
        # The sweep reached past validation: some requests of each kind were accepted.
        assert answered.get(200, 0) > REQUESTS // 20 and answered.get(201, 0) > 0, answered
        assert answered.get(400, 0) > REQUESTS // 5, answered

        # And the server still does its job.
        queue = "sweep-after"
        r = http.post(f"{base}/api/v1/push", json={"items": [{"queue": queue, "payload": 7}]}, timeout=10)
        assert r.status_code == 201, r.text
        r = http.get(f"{base}/api/v1/pop/queue/{queue}?wait=true&timeout=5000", timeout=10)
        assert r.status_code == 200, r.text
        (message,) = r.json()["messages"]
        assert message["data"] == 7
        ack = {"transactionId": message["transactionId"], "leaseId": message["leaseId"], "status": "completed"}
        r = http.post(f"{base}/api/v1/ack", json=ack, timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text
