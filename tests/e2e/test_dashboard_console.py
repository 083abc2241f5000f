"""The console's pages in headless Chromium against a real gunicorn (two workers and its
maintenance): rates, consumers, nodes, the test message, oldest pending, sign-in first and
loading states. What a page shows is checked against the API route it reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.conftest import Server, cloned_database
from tests.e2e.browser import chromium, find_all, missing, screenshot, text_of, wait_until
from tests.e2e.test_auth import create
from tests.e2e.test_dashboard_browser import (
    FAST,
    WAIT,
    api,
    click,
    painted,
    push,
    sign_in,
    status_of,
    visit,
)
from tests.e2e.test_maintenance import Maintainer

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def secured(server_dsn: str, template_db: str) -> Iterator[tuple[Server, str]]:
    with cloned_database(server_dsn, template_db, "queen_browser_console_auth") as dsn:
        reader = create(dsn, "reader", "console-reader")
        srv = Server(dsn, QUEEN_AUTH="on", **FAST).start()
        yield srv, reader
        srv.stop()


@pytest.fixture(scope="module")
def cluster(
    server_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with cloned_database(server_dsn, template_db, "queen_browser_console") as dsn:
        maintainer = Maintainer(dsn, tmp_path_factory.mktemp("console")).start()
        srv = Server(dsn, workers=2, **FAST).start()
        yield srv
        srv.stop()
        maintainer.stop()


def rates_of(srv: Server, queue: str) -> dict[str, Any]:
    (doc,) = api(srv, "GET", f"/analytics/rates?queue={queue}").json()["queues"]
    return doc  # type: ignore[no-any-return]


def test_overview_shows_each_queues_rates_and_last_hour(browser, cluster):
    push(cluster, *({"queue": "rated", "payload": {"n": i}} for i in range(30)))
    popped = api(cluster, "GET", f"/pop/queue/rated?batch=10&{WAIT}").json()["messages"]
    acks = [{"transactionId": m["transactionId"], "status": "completed"} for m in popped]
    assert api(cluster, "POST", "/ack/batch", json={"acknowledgments": acks}).status_code == 200
    rates = rates_of(cluster, "rated")
    assert sum(m["incoming"] for m in rates["minutes"]) == 30
    assert sum(m["outgoing"] for m in rates["minutes"]) == 10
    assert rates["now"]["incomingPerSecond"] > rates["now"]["outgoingPerSecond"] > 0

    visit(browser, cluster)
    row = "#queue-rows tr.queue"
    wait_until(lambda: any("rated" in r.text for r in find_all(browser, row)), what="the row")
    wait_until(lambda: not find_all(browser, ".value.loading"), what="the numbers loaded")
    cells = wait_until(
        lambda: [c.text for c in find_all(browser, f"{row} td.rate") if c.text not in ("…", "0")],
        what="the rates",
    )
    assert len(cells) == 2 and all(float(c) > 0 for c in cells)
    wait_until(lambda: painted(browser, f"{row} td.trend canvas"), what="the last hour's chart")
    wait_until(lambda: painted(browser, "#chart canvas"), what="the throughput chart")


def test_consumers_page_lists_the_live_leases(browser, cluster):
    push(cluster, *({"queue": "leased", "partition": f"p{i}", "payload": i} for i in range(3)))
    api(cluster, "GET", f"/pop/queue/leased/partition/p0?{WAIT}")
    api(cluster, "GET", f"/pop/queue/leased/partition/p1?consumerGroup=audit&{WAIT}")
    leases = api(cluster, "GET", "/leases?queue=leased").json()["leases"]
    assert {(lease["partition"], lease["consumerGroup"]) for lease in leases} >= {
        ("p0", None),
        ("p1", "audit"),
    }
    visit(browser, cluster, "#/consumers?queue=leased")
    for lease in leases:
        css = f"tr[data-lease='{lease['leaseId']}']"
        wait_until(lambda css=css: find_all(browser, css), what=f"lease {lease['partition']}")
        assert lease["workerId"] in text_of(browser, f"{css} td.worker")
        assert (lease["consumerGroup"] or "queue mode") in text_of(browser, css)
    screenshot(browser, "consumers")


def test_nodes_page_shows_every_worker_and_the_leader(browser, cluster):
    def workers() -> list[dict[str, Any]]:
        doc = api(cluster, "GET", "/system/nodes").json()
        return [w for h in doc["hosts"] for w in h["workers"]]

    found = wait_until(lambda: len(workers()) == 2 and workers(), what="both workers' notes")
    doc = api(cluster, "GET", "/system/nodes").json()
    assert all(w["rssBytes"] > 0 and w["pool"]["max"] >= 1 for w in found)
    assert any(s["connections"] > 0 for s in doc["database"]["sessions"])
    visit(browser, cluster, "#/nodes")
    for worker in found:
        wait_until(
            lambda w=worker: find_all(browser, f"tr[data-worker='{w['workerId']}']"),
            what=f"worker {worker['workerId']}",
        )
    leader = wait_until(
        lambda: api(cluster, "GET", "/system/nodes").json()["maintenanceLeader"],
        what="a maintenance leader",
    )
    wait_until(
        lambda: text_of(browser, "[data-stat='Maintenance leader']") == leader,
        what="the leader on the page",
    )
    screenshot(browser, "nodes")


def test_a_test_message_is_published_and_fetched_from_the_queue_page(browser, cluster):
    push(cluster, {"queue": "trial", "payload": "seed"})  # the queue exists
    (seed,) = api(cluster, "GET", f"/pop/queue/trial?{WAIT}").json()["messages"]
    api(
        cluster,
        "POST",
        "/ack",
        json={"transactionId": seed["transactionId"], "status": "completed"},
    )  # and has nothing waiting
    visit(browser, cluster, "#/queue/trial")
    field = wait_until(lambda: find_all(browser, "#test-payload"), what="the form")[0]
    field.clear()
    field.send_keys('{"hello": "console"}')
    click(browser, "#publish-test")
    txid = wait_until(lambda: text_of(browser, "a.published"), what="the published id")
    assert status_of(cluster, txid) == "pending"
    click(browser, "#fetch-test")
    wait_until(lambda: text_of(browser, "a.fetched-id") == txid, what="the fetched message")
    assert '"hello": "console"' in text_of(browser, "pre.fetched")
    wait_until(lambda: status_of(cluster, txid) == "completed", what="the message completed")


def test_oldest_pending_ignores_completed_messages(browser, cluster):
    push(cluster, {"queue": "aged", "partition": "done", "payload": 1})
    push(cluster, {"queue": "aged", "partition": "waiting", "payload": 2})
    (m,) = api(cluster, "GET", f"/pop/queue/aged/partition/done?{WAIT}").json()["messages"]
    api(cluster, "POST", "/ack", json={"transactionId": m["transactionId"], "status": "completed"})
    parts = {
        p["name"]: p for p in api(cluster, "GET", "/resources/queues/aged").json()["partitions"]
    }
    assert parts["done"]["oldestPending"] is None and parts["done"]["oldestMessage"]
    assert parts["waiting"]["oldestPending"] == parts["waiting"]["oldestMessage"]
    visit(browser, cluster, "#/queue/aged")
    wait_until(
        lambda: find_all(browser, "tr[data-partition='waiting'] td.oldest-pending"),
        what="the partitions",
    )
    assert text_of(browser, "tr[data-partition='done'] td.oldest-pending") == "–"
    assert text_of(browser, "tr[data-partition='waiting'] td.oldest-pending").endswith("s")


def test_under_auth_the_sign_in_form_comes_before_the_page(browser, secured):
    srv, reader = secured
    visit(browser, srv)
    browser.execute_script("sessionStorage.clear(); localStorage.clear();")
    visit(browser, srv)
    wait_until(lambda: browser.find_element("id", "login-token").is_displayed(), what="the form")
    for hidden in ("view-overview", "tabs"):
        assert not browser.find_element("id", hidden).is_displayed()
    screenshot(browser, "sign-in")
    sign_in(browser, srv, reader, "")
    wait_until(
        lambda: browser.find_element("id", "view-overview").is_displayed(),
        what="the overview after signing in",
    )
    assert not browser.find_element("id", "login").is_displayed()


def test_an_alert_set_on_the_page_fires_and_is_removed(browser, cluster):
    push(cluster, *({"queue": "alerted", "payload": i} for i in range(5)))
    visit(browser, cluster)
    form = wait_until(lambda: find_all(browser, "#alert-form"), what="the alert form")[0]
    form.find_element("name", "name").send_keys("alerted-backlog")
    form.find_element("name", "queue").send_keys("alerted")
    form.find_element("name", "threshold").send_keys("3")
    click(browser, "#add-alert")
    row = "tr[data-alert='alerted-backlog']"
    wait_until(lambda: "firing" in text_of(browser, row), what="the alert firing on the page")
    (alert,) = [
        a for a in api(cluster, "GET", "/alerts").json()["alerts"] if a["name"] == "alerted-backlog"
    ]
    assert (alert["kind"], alert["threshold"], alert["value"], alert["firing"]) == (
        "depth",
        3,
        5,
        True,
    )
    metrics = requests.get(f"{cluster.url}/metrics/prometheus", timeout=10).text
    assert 'queen_alert_firing{alert="alerted-backlog",kind="depth",queue="alerted"} 1.0' in metrics
    screenshot(browser, "overview")
    click(browser, f"{row} button.delete-alert")
    wait_until(lambda: not find_all(browser, row), what="the alert removed")
    assert "alerted-backlog" not in {
        a["name"] for a in api(cluster, "GET", "/alerts").json()["alerts"]
    }
