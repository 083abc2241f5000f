"""A database path that freezes (a stalled proxy: TCP still acknowledged, nothing answered),
at default settings: hot-path requests answer 503 within QUEEN_HOT_PATH_TIMEOUT + 2 s, and
a maintenance leader cut off that way loses the leader lock within a stated bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from queen.errors import Unavailable
from queen.store.maintenance import HEARTBEAT_S, IDLE_SESSION_S, MaintenanceSession
from tests.conftest import Server
from tests.faults.conftest import through
from tests.faults.proxy import Proxy

# The hot path's deadline at default settings is 5 s + 2 s; the watchdog looks every 0.5 s.
# Before it had one of its own, a call waited statement_timeout + 2 = 32 s.
HOT_PATH_BOUND_S = 7.5
SLACK_S = 5.0  # a loaded 2-core machine's share


@pytest.fixture
def server_through_proxy(
    db_dsn: str, proxy_to_shared: Proxy, tmp_path: Path
) -> Iterator[tuple[Server, Proxy]]:
    server = Server(through(proxy_to_shared, db_dsn), workers=1, log_path=tmp_path / "gunicorn.log")
    server.start(timeout=60)
    yield server, proxy_to_shared
    proxy_to_shared.frozen.clear()
    server.stop()


@pytest.mark.faults
def test_hot_path_requests_answer_503_within_their_deadline_at_default_settings(
    server_through_proxy: tuple[Server, Proxy],
) -> None:
    server, proxy = server_through_proxy
    api = f"{server.url}/api/v1"
    http = requests.Session()
    pushed = http.post(f"{api}/push", json={"items": [{"queue": "frozen", "payload": 1}]})
    assert pushed.status_code == 201, pushed.text
    popped = http.get(f"{api}/pop/queue/frozen", params={"wait": "false"})
    assert popped.status_code == 200, popped.text
    (message,) = popped.json()["messages"]
    ack = {"transactionId": message["transactionId"], "leaseId": message["leaseId"],
           "status": "completed"}

    proxy.frozen.set()
    answers = {}
    for name, send in (
        ("push", lambda: http.post(f"{api}/push", json={"items": [{"queue": "frozen",
                                                                     "payload": 2}]}, timeout=60)),
        ("ack", lambda: http.post(f"{api}/ack", json=ack, timeout=60)),
        ("pop", lambda: http.get(f"{api}/pop/queue/frozen", params={"wait": "false"},
                                 timeout=60)),
    ):
        started = time.monotonic()
        resp = send()
        answers[name] = (resp.status_code, time.monotonic() - started, resp.json().get("error"))
    for status, took, _ in answers.values():
        assert status == 503, answers
        assert took < HOT_PATH_BOUND_S + SLACK_S, answers
    # The first call was cut by its deadline and says what that means for a retry.
    assert "may or may not have been applied" in answers["push"][2], answers

    proxy.frozen.clear()
    deadline = time.monotonic() + 30
    while True:
        resp = http.post(f"{api}/ack", json=ack, timeout=30)
        if resp.status_code == 200:
            break
        assert resp.status_code == 503 and time.monotonic() < deadline, resp.text
        time.sleep(0.5)
    assert resp.json()["success"] is True, resp.text


@pytest.mark.faults
def test_a_leader_behind_a_frozen_path_loses_the_lock_within_its_bound(
    db_dsn: str, proxy_to_shared: Proxy
) -> None:
    cut_off = MaintenanceSession(through(proxy_to_shared, db_dsn), application_name="cut-off")
    standby = MaintenanceSession(db_dsn, application_name="standby")
    cut_off.connect()
    standby.connect()
    stepped_down: list[float] = []

    def lead() -> None:  # the leader's idle loop: wait for notifications, heartbeat
        try:
            while True:
                cut_off.wait(0.5)
        except Unavailable:
            stepped_down.append(time.monotonic())

    try:
        assert cut_off.try_lead() and not standby.try_lead()
        leading = threading.Thread(target=lead, daemon=True)
        leading.start()
        time.sleep(2 * HEARTBEAT_S)  # heartbeats keep an idle leader's session alive
        assert not standby.try_lead() and not stepped_down

        proxy_to_shared.frozen.set()
        frozen_at = time.monotonic()
        while not standby.try_lead():
            # The server ends the cut-off session IDLE_SESSION_S after its last statement.
            assert time.monotonic() - frozen_at < IDLE_SESSION_S + SLACK_S, "no takeover"
            time.sleep(0.25)
        took_over = time.monotonic() - frozen_at
        # The cut-off leader learns it at its next heartbeat's deadline.
        leading.join(HEARTBEAT_S + IDLE_SESSION_S + 2 * SLACK_S)
        assert stepped_down, "the cut-off leader never noticed"
        noticed = stepped_down[0] - frozen_at
        assert noticed < HEARTBEAT_S + IDLE_SESSION_S + SLACK_S
        assert not cut_off.connected
        print(f"\nleader takeover {took_over:.1f}s, old leader stepped down {noticed:.1f}s")
    finally:
        proxy_to_shared.frozen.clear()
        cut_off.close()
        standby.close()
