"""README's consumer-group example, run after its first-message example on one server:
each group gets the message the block pushed."""

from __future__ import annotations

import re

import requests

from tests.conftest import ROOT
from tests.e2e.servers import module_dsn, module_server

__all__ = ["module_dsn", "module_server"]  # fixtures

API = "/api/v1"


def group_block() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("Q=localhost:6632/api/v1")
    return readme[start : readme.index("```", start)]


def test_the_group_example_pops_what_it_pushed(module_server) -> None:
    url = module_server.url + API
    # "A first message": orders/eu, popped and acked in queue mode.
    requests.post(f"{url}/push", json={"items": [
        {"queue": "orders", "partition": "eu", "payload": {"orderId": 12345}}]}, timeout=30)
    (first,) = requests.get(f"{url}/pop/queue/orders", timeout=30).json()["messages"]
    requests.post(f"{url}/ack", json={"transactionId": first["transactionId"],
                                      "status": "completed"}, timeout=30)

    block = group_block()
    (pushed,) = re.findall(r'"queue": "([^"]+)", "payload": \{"orderId": 1\}\}\]\}\'', block)
    popped = re.findall(r"/pop/queue/([^?]+)\?consumerGroup=(\w+)&subscriptionMode=all", block)
    assert [g for _, g in popped] == ["billing", "audit"]
    assert {q for q, _ in popped} == {pushed}
    requests.post(f"{url}/push", json={"items": [
        {"queue": pushed, "payload": {"orderId": 1}}]}, timeout=30)
    for queue, group in popped:
        resp = requests.get(f"{url}/pop/queue/{queue}", timeout=30,
                            params={"consumerGroup": group, "subscriptionMode": "all"})
        assert [m["data"] for m in resp.json()["messages"]] == [{"orderId": 1}]
