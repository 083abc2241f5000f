"""The dashboard's pages in headless Chromium against a real gunicorn: data appears, actions
change the server's state (checked through the API), and each page's screenshot is saved
(under docs/screenshots/ with QUEEN_SCREENSHOTS=docs). One browser for the whole module."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.conftest import Server, cloned_database
from tests.e2e.browser import chromium, find_all, missing, screenshot, text_of, wait_until
from tests.e2e.test_auth import bearer, create

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

WAIT = "wait=true&timeout=5000"  # a pop right after a push may find the partition not yet ready
FAST: dict[str, Any] = {  # Any: mypy would match str values against Server's other parameters
    "QUEEN_DASHBOARD_DEPTH_INTERVAL": "0.5", "QUEEN_DASHBOARD_STATS_INTERVAL": "0.5",
    "QUEEN_DASHBOARD_FLUSH_INTERVAL": "0.25",
}


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
    url = f"{site.url}/dashboard{fragment}"
    if browser.current_url == url:
        browser.refresh()  # the page is there already: going to it again would not load it
    else:
        browser.get(url)


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


def test_queue_delete_asks_first_then_deletes_the_queue(browser, site):
    push(site, {"queue": "doomed", "payload": {"n": 1}})
    visit(browser, site, "#/queue/doomed")
    click(browser, "#delete-queue")
    wait_until(lambda: browser.execute_script("return document.getElementById('confirm').open"),
               what="the confirmation dialog")
    assert "doomed" in text_of(browser, "#confirm")
    click(browser, "#confirm-no")  # asked, refused: nothing happens
    assert api(site, "GET", "/resources/queues/doomed").status_code == 200
    click(browser, "#delete-queue")
    confirm(browser)
    wait_until(lambda: browser.execute_script("return location.hash") == "#/",
               what="the overview, once deleted")
    assert api(site, "GET", "/resources/queues/doomed").status_code == 404


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
    wait_until(lambda: len(find_all(browser, "table.dead-letters tr[data-txid]")) == 2,
               what="two left")  # else Retry all may still hold the deleted one

    click(browser, "#retry-all")
    confirm(browser)
    wait_until(lambda: status_of(site, third) == "pending" and status_of(site, fourth) == "pending",
               what="the rest retried")
    wait_until(lambda: "Nothing here." in text_of(browser, "table.dead-letters"),
               what="an empty list")


# -- consumer groups: a server of their own ------------------------------------------------

N = 12  # messages each groups test pushes into its queue, over three partitions


@pytest.fixture(scope="module")
def groups_site(server_dsn: str, template_db: str) -> Iterator[Server]:
    with cloned_database(server_dsn, template_db, "queen_browser_groups") as dsn:
        srv = Server(dsn, **FAST).start()
        yield srv
        srv.stop()


def pop_as(site: Server, queue: str, group: str | None, batch: int = 1,
           wait: bool = True, **params: str) -> list[dict[str, Any]]:
    """Pop as a consumer group (None: queue mode); [] when there is nothing to pop."""
    query: dict[str, Any] = {"batch": batch, **params}
    if group is not None:
        query["consumerGroup"] = group
    resp = api(site, "GET", f"/pop/queue/{queue}" + (f"?{WAIT}" if wait else ""), params=query)
    assert resp.status_code in (200, 204), resp.text
    return resp.json()["messages"] if resp.status_code == 200 else []


def ack_all(site: Server, messages: list[dict[str, Any]]) -> None:
    acks = [{"transactionId": m["transactionId"], "status": "completed", "leaseId": m["leaseId"],
             "consumerGroup": m["consumerGroup"]} for m in messages]
    resp = api(site, "POST", "/ack/batch", json={"acknowledgments": acks})
    assert resp.status_code == 200, resp.text
    assert {r["status"] for r in resp.json()["results"]} == {"completed"}, resp.text


def make_groups(site: Server, queue: str) -> None:
    """N messages in queue; "billing" acks what one pop gives it, "audit" holds a lease and
    acks nothing, "late" joins at the end (subscriptionMode new): three pending counts."""
    push(site, *({"queue": queue, "partition": f"p{i % 3}", "payload": {"n": i}}
                 for i in range(N)))
    ack_all(site, pop_as(site, queue, "billing", batch=N))
    assert pop_as(site, queue, "audit", batch=2)
    assert pop_as(site, queue, "late", wait=False, subscriptionMode="new") == []


def groups_of(site: Server, queue: str) -> dict[str, dict[str, Any]]:
    resp = api(site, "GET", "/consumer-groups", params={"queue": queue})
    assert resp.status_code == 200, resp.text
    return {g["name"]: g for g in resp.json()["consumerGroups"]}


def row(group: str, queue: str) -> str:
    return f"table.groups tr[data-group='{group}'][data-queue='{queue}']"


def cell(browser: Any, group: str, queue: str, field: str) -> str:
    return text_of(browser, f"{row(group, queue)} td[data-field='{field}']")


def shows(browser: Any, group: str, queue: str, pending: int) -> bool:
    return bool(find_all(browser, row(group, queue))) and cell(
        browser, group, queue, "pending") == f"{pending:,}"


def seek_in_page(browser: Any, group: str, queue: str, to: str) -> None:
    from selenium.webdriver.support.ui import Select

    wait_until(lambda: find_all(browser, f"{row(group, queue)} select.seek-to"),
               what=f"the seek controls of {group}")
    Select(find_all(browser, f"{row(group, queue)} select.seek-to")[0]).select_by_value(to)
    click(browser, f"{row(group, queue)} button.seek")


def test_consumer_groups_page_shows_each_group_as_the_api_counts_it(browser, groups_site):
    make_groups(groups_site, "ledger")
    push(groups_site, {"queue": "refunds", "payload": 1})
    assert pop_as(groups_site, "refunds", "billing")  # the same group on a second queue
    assert pop_as(groups_site, "ledger", None)  # queue mode reads the queue too
    for _ in range(2):  # 1,200 in one partition: more than a listing counts in one
        push(groups_site, *({"queue": "backlog", "payload": i} for i in range(600)))
    assert pop_as(groups_site, "backlog", "billing")
    listed = groups_of(groups_site, "ledger")
    assert set(listed) == {"billing", "audit", "late", "__queue__"}
    assert listed["audit"]["pending"] == N and listed["late"]["pending"] == 0
    assert 0 < listed["billing"]["pending"] < N

    visit(browser, groups_site, "#/groups")
    wait_until(lambda: all(find_all(browser, row(g, "ledger")) for g in listed)
               and find_all(browser, row("billing", "refunds"))
               and find_all(browser, row("billing", "backlog")), what="every group's row")
    for name, g in groups_of(groups_site, "ledger").items():
        assert cell(browser, name, "ledger", "pending") == f"{g['pending']:,}", name
        assert cell(browser, name, "ledger", "partitions") == f"{g['partitions']:,}", name
        assert cell(browser, name, "ledger", "leased") == f"{g['leasedPartitions']:,}", name
        lag = cell(browser, name, "ledger", "lag")
        assert lag.endswith("s") and abs(int(lag[:-1]) - g["lagSeconds"]) <= 5, (name, lag)
    (capped,) = groups_of(groups_site, "backlog").values()
    assert capped["pendingCapped"], capped
    assert cell(browser, "billing", "backlog", "pending") == f"{capped['pending']:,}+"
    assert cell(browser, "late", "ledger", "reads") == "new messages"
    assert cell(browser, "billing", "ledger", "reads") == "all messages"
    assert "queue mode" in text_of(browser, row("__queue__", "ledger"))
    assert not find_all(browser, f"{row('__queue__', 'ledger')} button.delete-group")
    assert find_all(browser, f"{row('__queue__', 'ledger')} button.seek")
    screenshot(browser, "consumer-groups")

    push(groups_site, {"queue": "ledger", "payload": "one more"})
    click(browser, "#refresh-groups")
    wait_until(lambda: shows(browser, "late", "ledger", 1), what="the new message counted")


def test_seek_and_delete_on_the_groups_page_change_the_groups(browser, groups_site):
    make_groups(groups_site, "payroll")
    visit(browser, groups_site, "#/groups")
    wait_until(lambda: find_all(browser, row("billing", "payroll")), what="billing's row")

    seek_in_page(browser, "billing", "payroll", "end")
    wait_until(lambda: groups_of(groups_site, "payroll")["billing"]["pending"] == 0,
               what="billing at the end")
    wait_until(lambda: shows(browser, "billing", "payroll", 0), what="the page showing 0")
    assert "moved to end" in text_of(browser, "#view-page .notices")
    assert groups_of(groups_site, "payroll")["audit"]["pending"] == N  # only billing moved

    seek_in_page(browser, "billing", "payroll", "beginning")
    wait_until(lambda: groups_of(groups_site, "payroll")["billing"]["pending"] == N,
               what="billing back at the beginning")
    wait_until(lambda: shows(browser, "billing", "payroll", N), what=f"the page showing {N}")

    seek_in_page(browser, "audit", "payroll", "time")  # no time picked yet: said, not sent
    wait_until(lambda: "Pick the time" in text_of(browser, "#view-page .notices"),
               what="the missing time")
    boundary = math.ceil(time.time() + 0.2)  # a whole second: the field shows seconds
    time.sleep(boundary - time.time() + 0.3)
    later = push(groups_site, *({"queue": "payroll", "payload": {"late": i}} for i in range(3)))
    browser.execute_script("""
        const d = new Date(arguments[1] * 1000);  // the field takes the browser's local time
        d.setMinutes(d.getMinutes() - d.getTimezoneOffset());
        document.querySelector(arguments[0]).value = d.toISOString().slice(0, 19);""",
        f"{row('audit', 'payroll')} input.seek-time", boundary)
    click(browser, f"{row('audit', 'payroll')} button.seek")
    wait_until(lambda: groups_of(groups_site, "payroll")["audit"]["pending"] == len(later),
               what="audit past the messages before the time")
    wait_until(lambda: shows(browser, "audit", "payroll", len(later)), what="the page showing it")

    click(browser, f"{row('audit', 'payroll')} button.delete-group")
    confirm(browser)
    wait_until(lambda: "audit" not in groups_of(groups_site, "payroll"), what="audit deleted")
    wait_until(lambda: not find_all(browser, row("audit", "payroll")), what="its row gone")
    assert find_all(browser, row("billing", "payroll"))


def test_the_queue_page_lists_and_seeks_the_groups_of_that_queue(browser, groups_site):
    make_groups(groups_site, "invoices")
    push(groups_site, {"queue": "receipts", "payload": 1})
    assert pop_as(groups_site, "receipts", "printer")
    visit(browser, groups_site, "#/queue/invoices")
    wait_until(lambda: find_all(browser, ".groups-box " + row("billing", "invoices")),
               what="the groups panel")
    shown = {(r.get_attribute("data-group"), r.get_attribute("data-queue"))
             for r in find_all(browser, ".groups-box table.groups tr[data-group]")}
    assert shown == {(g, "invoices") for g in groups_of(groups_site, "invoices")}

    seek_in_page(browser, "audit", "invoices", "end")
    wait_until(lambda: groups_of(groups_site, "invoices")["audit"]["pending"] == 0,
               what="audit at the end")
    wait_until(lambda: shows(browser, "audit", "invoices", 0), what="the panel showing 0")


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
    assert not find_all(browser, "#clear-queue, #delete-queue, #save-options")
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


@pytest.fixture(scope="module")
def secured_groups(server_dsn: str, template_db: str) -> Iterator[tuple[Server, dict[str, str]]]:
    with cloned_database(server_dsn, template_db, "queen_browser_auth_groups") as dsn:
        tokens = {role: create(dsn, role, f"ops-{role}") for role in ("reader", "consumer", "admin")}
        srv = Server(dsn, QUEEN_AUTH="on", **FAST).start()
        yield srv, tokens
        srv.stop()


def test_a_consumer_may_seek_a_group_and_only_an_admin_delete_it(browser, secured_groups):
    srv, tokens = secured_groups
    admin = bearer(tokens["admin"])
    items = [{"queue": "shifts", "payload": i} for i in range(3)]
    assert api(srv, "POST", "/push", json={"items": items}, headers=admin).status_code == 201
    popped = api(srv, "GET", f"/pop/queue/shifts?{WAIT}", params={"consumerGroup": "billing"},
                 headers=admin)
    assert popped.status_code == 200, popped.text

    def pending() -> int:
        resp = api(srv, "GET", "/consumer-groups", params={"queue": "shifts"}, headers=admin)
        return int(resp.json()["consumerGroups"][0]["pending"])

    sign_in(browser, srv, tokens["reader"], "#/groups")
    wait_until(lambda: find_all(browser, row("billing", "shifts")), what="the group, to a reader")
    assert not find_all(browser, "table.groups th.actions, table.groups button")

    sign_in(browser, srv, tokens["consumer"], "#/groups")
    wait_until(lambda: find_all(browser, f"{row('billing', 'shifts')} button.seek"),
               what="a consumer's seek button")
    assert not find_all(browser, "table.groups button.delete-group")
    seek_in_page(browser, "billing", "shifts", "end")
    wait_until(lambda: pending() == 0, what="the consumer's seek done")

    sign_in(browser, srv, tokens["admin"], "#/groups")
    wait_until(lambda: find_all(browser, f"{row('billing', 'shifts')} button.delete-group"),
               what="the admin's delete button")
