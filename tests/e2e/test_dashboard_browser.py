"""The dashboard's pages in headless Chromium against a real gunicorn: data appears, actions
change the server's state (checked through the API), and each page's screenshot is saved
(under docs/screenshots/ with QUEEN_SCREENSHOTS=docs). One browser for the whole module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.conftest import Server, cloned_database
from tests.e2e.browser import chromium, find_all, missing, screenshot, text_of, wait_until
from tests.e2e.test_auth import bearer, create

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

WAIT = "wait=true&timeout=5000"  # a pop right after a push may find the partition not yet ready
FAST = {"QUEEN_DASHBOARD_DEPTH_INTERVAL": "0.5", "QUEEN_DASHBOARD_STATS_INTERVAL": "0.5",
        "QUEEN_DASHBOARD_FLUSH_INTERVAL": "0.25"}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def site(server_dsn: str, template_db: str) -> Iterator[Server]:
    with cloned_database(server_dsn, template_db, "queen_browser") as dsn:
        srv = Server(dsn, **FAST).start()
        yield srv
        srv.stop()


def api(site: Server, method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(method, f"{site.url}/api/v1{path}", timeout=10, **kwargs)


def push(site: Server, *items: dict[str, Any]) -> list[str]:
    resp = api(site, "POST", "/push", json={"items": list(items)})
    assert resp.status_code == 201, resp.text
    return [m["transactionId"] for m in resp.json()["messages"]]


def dead_letters(site: Server, queue: str, count: int) -> list[str]:
    """Make `count` dead letters in queue (retryLimit 0: the first failure is final)."""
    api(site, "POST", "/configure", json={"queue": queue, "options": {"retryLimit": 0}})
    ids = push(site, *({"queue": queue, "payload": {"n": i}} for i in range(count)))
    popped = api(site, "GET", f"/pop/queue/{queue}?batch={count}&{WAIT}").json()["messages"]
    acks = [{"transactionId": m["transactionId"], "status": "failed", "error": "no such user"}
            for m in popped]
    assert api(site, "POST", "/ack/batch", json={"acknowledgments": acks}).status_code == 200
    return ids


def status_of(site: Server, txid: str) -> str | None:
    resp = api(site, "GET", f"/messages/{txid}")
    return resp.json()["status"] if resp.status_code == 200 else None


def visit(browser: Any, site: Server, fragment: str = "") -> None:
    browser.get(f"{site.url}/dashboard{fragment}")


def click(browser: Any, css: str) -> None:
    """Click the first match, scrolled to the middle (the sticky top bar hides the top)."""
    def attempt() -> bool:  # raises while the element is missing or was just re-rendered
        element = find_all(browser, css)[0]
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
        element.click()
        return True

    wait_until(attempt, what=f"a click on {css}")


def confirm(browser: Any) -> None:
    wait_until(lambda: browser.execute_script("return document.getElementById('confirm').open"),
               what="the confirmation dialog")
    click(browser, "#confirm-yes")


def painted(browser: Any, css: str) -> bool:
    """Tell whether a canvas has any non-transparent pixel."""
    return bool(browser.execute_script("""
        const c = document.querySelector(arguments[0]);
        if (!c || !c.width) return false;
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        for (let i = 3; i < px.length; i += 4) if (px[i]) return true;
        return false;""", css))


def test_overview_shows_queues_events_and_the_depth_trend(browser, site):
    push(site, *({"queue": "orders", "partition": f"p{i % 3}", "payload": {"n": i}}
                 for i in range(12)))
    visit(browser, site)
    wait_until(lambda: any("orders" in r.text and "12" in r.text
                           for r in find_all(browser, "#queue-rows tr.queue")),
               what="the orders row with its 12 pending")  # the table re-renders: no handles kept
    wait_until(lambda: painted(browser, "#queue-rows tr.queue td.trend canvas"),
               what="the depth sparkline")
    (txid,) = push(site, {"queue": "orders", "payload": {"late": True}})
    wait_until(lambda: txid in text_of(browser, "#events"), what="the pushed event in the log")
    wait_until(lambda: text_of(browser, "#stat-pending") not in ("", "–"), what="system stats")
    screenshot(browser, "overview")


def test_the_event_log_filters_by_kind_and_queue(browser, site):
    visit(browser, site)
    wait_until(lambda: browser.execute_script(
        "return document.getElementById('status').dataset.state") == "open", what="the socket")
    (kept,) = push(site, {"queue": "alpha", "payload": 1})
    (other,) = push(site, {"queue": "beta", "payload": 2})
    assert api(site, "GET", f"/pop/queue/alpha?{WAIT}").status_code == 200
    wait_until(lambda: other in text_of(browser, "#events"), what="both events")
    browser.find_element("id", "log-queue").send_keys("alpha")
    wait_until(lambda: other not in text_of(browser, "#events"), what="beta filtered out")
    assert kept in text_of(browser, "#events")
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", "log-kind")).select_by_value("message.processing")
    wait_until(lambda: {li.get_attribute("data-kind") for li in find_all(browser, "#events li")}
               == {"message.processing"}, what="only processing events")


def test_queue_page_shows_partitions_and_saves_options_and_clears(browser, site):
    push(site, *({"queue": "billing", "partition": p, "payload": {"p": p}}
                 for p in ("eu", "us", "us")))
    visit(browser, site, "#/queue/billing")
    wait_until(lambda: len(find_all(browser, "table.partitions tbody tr[data-partition]")) == 2,
               what="two partitions")
    us = find_all(browser, "tr[data-partition='us'] td")
    assert us[1].text == "2"  # pending
    wait_until(lambda: find_all(browser, ".groups-box table, .groups-box .notice"),
               what="the consumer groups section")
    screenshot(browser, "queue")

    field = browser.find_element("css selector", "#options-form input[name='retryLimit']")
    field.clear()
    field.send_keys("7")
    click(browser, "#save-options")
    wait_until(lambda: "saved" in text_of(browser, ".notices"), what="the saved notice")
    options = api(site, "GET", "/resources/queues/billing").json()["options"]
    assert options["retryLimit"] == 7

    click(browser, "#clear-queue")
    confirm(browser)
    wait_until(lambda: "Cleared 3" in text_of(browser, ".notices"), what="the cleared notice")
    assert api(site, "GET", "/resources/queues/billing").json()["totals"]["pending"] == 0


def test_message_browser_filters_pages_and_shows_a_message(browser, site):
    ids = push(site, *({"queue": "letters", "partition": "a", "payload": {"n": i, "to": "x@y"}}
                       for i in range(60)))
    assert len(api(site, "GET", f"/pop/queue/letters?batch=5&{WAIT}").json()["messages"]) == 5
    visit(browser, site, "#/messages?queue=letters&status=pending")
    wait_until(lambda: len(find_all(browser, "table.messages tr[data-txid]")) == 50,
               what="a page of 50")
    statuses = {e.text for e in find_all(browser, "table.messages .badge")}
    assert statuses == {"pending"}
    screenshot(browser, "messages")
    click(browser, ".pager .next")
    wait_until(lambda: len(find_all(browser, "table.messages tr[data-txid]")) == 5,
               what="the second page (55 pending)")

    visit(browser, site, f"#/message/{ids[0]}")
    payload = wait_until(lambda: text_of(browser, "#payload"), what="the payload")
    assert json.loads(payload) == {"n": 0, "to": "x@y"}
    assert "\n" in payload  # pretty printed
    assert text_of(browser, "dd[data-fact='Status']") == "processing"
    assert text_of(browser, "dd[data-fact='Lease expires']") != "–"
    screenshot(browser, "message")


def test_dead_letters_retry_one_retry_all_and_delete(browser, site):
    first, second, third, fourth = dead_letters(site, "mailer", 4)
    visit(browser, site, "#/dead-letters?queue=mailer")
    wait_until(lambda: len(find_all(browser, "table.dead-letters tr[data-txid]")) == 4,
               what="four dead letters")
    assert "no such user" in text_of(browser, "table.dead-letters")
    screenshot(browser, "dead-letters")

    click(browser, f"tr[data-txid='{first}'] button.retry")
    wait_until(lambda: status_of(site, first) == "pending", what="the retried message pending")
    wait_until(lambda: len(find_all(browser, "table.dead-letters tr[data-txid]")) == 3,
               what="three left")

    click(browser, f"tr[data-txid='{second}'] button.delete")
    confirm(browser)
    wait_until(lambda: status_of(site, second) is None, what="the deleted message gone")

    click(browser, "#retry-all")
    confirm(browser)
    wait_until(lambda: status_of(site, third) == "pending" and status_of(site, fourth) == "pending",
               what="the rest retried")
    wait_until(lambda: "Nothing here." in text_of(browser, "table.dead-letters"),
               what="an empty list")


def test_consumer_groups_page_shows_what_the_server_says(browser, site):
    resp = api(site, "GET", "/consumer-groups")
    visit(browser, site, "#/groups")
    if resp.status_code == 200:
        wait_until(lambda: find_all(browser, "table.groups"), what="the groups table")
    else:
        message = resp.json()["error"]
        wait_until(lambda: message in text_of(browser, "#view-page"), what="the server's error")
    screenshot(browser, "consumer-groups")


@pytest.fixture(scope="module")
def secured(server_dsn: str, template_db: str) -> Iterator[tuple[Server, str, str]]:
    with cloned_database(server_dsn, template_db, "queen_browser_auth") as dsn:
        reader, admin = create(dsn, "reader", "ops-reader"), create(dsn, "admin", "ops-admin")
        srv = Server(dsn, QUEEN_AUTH="on", **FAST).start()
        yield srv, reader, admin
        srv.stop()


def sign_in(browser: Any, srv: Server, token: str, fragment: str) -> None:
    visit(browser, srv, fragment)
    browser.execute_script("sessionStorage.clear(); localStorage.clear();")
    visit(browser, srv, fragment)
    field = wait_until(lambda: [f for f in find_all(browser, "#login-token") if f.is_displayed()],
                       what="the sign-in form")[0]
    field.send_keys(token)
    click(browser, "#login button[type='submit']")
    wait_until(lambda: text_of(browser, "#role"), what="the role shown")


def test_a_reader_sees_no_action_buttons(browser, secured):
    srv, reader, admin = secured
    assert requests.get(f"{srv.url}/api/v1/auth/me", headers=bearer(reader),
                        timeout=10).json()["role"] == "reader"
    dead = dead_letters_with(srv, admin, "guarded")
    sign_in(browser, srv, reader, "#/dead-letters?queue=guarded")
    wait_until(lambda: find_all(browser, f"tr[data-txid='{dead}']"), what="the dead letter")
    assert not find_all(browser, "#view-page button.retry, #view-page button.delete, #retry-all")
    visit(browser, srv, "#/queue/guarded")
    wait_until(lambda: find_all(browser, "#options-form"), what="the options")
    assert not find_all(browser, "#clear-queue, #save-options")
    assert all(not f.is_enabled() for f in find_all(browser, "#options-form input"))
    visit(browser, srv, f"#/message/{dead}")
    wait_until(lambda: text_of(browser, "#payload"), what="the payload")
    assert not find_all(browser, "#retry-message, #delete-message, #dlq-message")

    sign_in(browser, srv, admin, f"#/message/{dead}")
    wait_until(lambda: find_all(browser, "#retry-message"), what="the admin's retry button")


def dead_letters_with(srv: Server, token: str, queue: str) -> str:
    headers = bearer(token)
    base = f"{srv.url}/api/v1"
    requests.post(f"{base}/configure", json={"queue": queue, "options": {"retryLimit": 0}},
                  headers=headers, timeout=10)
    pushed = requests.post(f"{base}/push", json={"items": [{"queue": queue, "payload": 1}]},
                           headers=headers, timeout=10).json()
    txid = pushed["messages"][0]["transactionId"]
    requests.get(f"{base}/pop/queue/{queue}?{WAIT}", headers=headers, timeout=10)
    requests.post(f"{base}/ack", json={"transactionId": txid, "status": "failed", "error": "x"},
                  headers=headers, timeout=10)
    return str(txid)
