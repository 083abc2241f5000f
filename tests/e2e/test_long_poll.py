"""Long polling against real gunicorn processes: wake-ups travel through PostgreSQL.

The fallback re-check is pushed far out (QUEEN_POLL_FALLBACK=60) wherever a prompt
answer must be explained by a notification.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import requests

from tests import storage
from tests.conftest import Server
from tests.e2e.polls import Poll, gather

NO_FALLBACK = {"QUEEN_POLL_FALLBACK": "60"}
# Seconds from the push's response to the poll's response. Wake latency itself is measured
# by the bench's latency phase; here the bound only has to tell a notification from the fallback
# re-check (60 s away), with room for a loaded 2-core machine.
PROMPT = 3.0
PARK = 0.5  # seconds to let a poll reach the database and park


@pytest.fixture
def quiet_server(db_dsn: str) -> Iterator[Server]:
    srv = Server(db_dsn, **NO_FALLBACK).start()
    yield srv
    srv.stop()


@contextlib.contextmanager
def servers(*group: Server) -> Iterator[tuple[Server, ...]]:
    try:
        for srv in group:
            srv.start()
        yield group
    finally:
        for srv in group:
            srv.stop()


def push(url: str, items: list[dict[str, Any]]) -> float:
    """Push items; return when the response arrived."""
    response = requests.post(f"{url}/api/v1/push", json={"items": items}, timeout=10)
    assert response.status_code == 201, response.text
    return time.monotonic()


def item(queue: str = "q", partition: str = "p", **payload: Any) -> dict[str, Any]:
    return {"queue": queue, "partition": partition, "payload": payload or {"n": 1}}


def sql(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def statuses(dsn: str) -> dict[str, int]:
    return dict(sql(dsn, storage.STATUS_COUNTS))  # type: ignore[arg-type]


def listener_pids(dsn: str) -> list[int]:
    rows = sql(
        dsn,
        "SELECT pid FROM pg_stat_activity"
        " WHERE application_name = 'queen-listener' AND datname = current_database()",
    )
    return [r[0] for r in rows]


def wait_for(check: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_a_parked_poll_is_answered_promptly_on_every_route(quiet_server):
    url = quiet_server.url
    requests.post(f"{url}/api/v1/configure", json={"queue": "tagged", "namespace": "ns"}, timeout=5)
    routes = [
        ("/api/v1/pop/queue/q/partition/p", item("q", "p")),
        ("/api/v1/pop/queue/q", item("q", "other")),
        ("/api/v1/pop?namespace=ns", item("tagged", "p")),
    ]
    for path, pushed in routes:
        poll = Poll(
            quiet_server.port, f"{path}{'&' if '?' in path else '?'}wait=true&timeout=10000"
        )
        time.sleep(PARK)
        pushed_at = push(url, [pushed])
        assert gather([poll], 10) == []
        assert poll.status == 200, path
        assert poll.body["messages"][0]["queue"] == pushed["queue"]
        assert poll.done_at - pushed_at < PROMPT, path  # type: ignore[operator]


def test_one_push_promptly_answers_a_parked_poll_of_every_consumer_group(quiet_server):
    """Three groups' polls on two workers: one worker holds two groups' polls at least,
    and each group reads every message, so its notification must wake both of them."""
    url, groups = quiet_server.url, ["g1", "g2", "g3"]
    push(url, [item("fan", "p")])
    for group in groups:  # every group known, and past the first message
        popped = requests.get(f"{url}/api/v1/pop/queue/fan?consumerGroup={group}", timeout=10)
        (message,) = popped.json()["messages"]
        acked = requests.post(
            f"{url}/api/v1/ack",
            json={
                "transactionId": message["transactionId"],
                "status": "completed",
                "consumerGroup": group,
            },
            timeout=10,
        )
        assert acked.status_code == 200, acked.text
    polls = [
        Poll(quiet_server.port, f"/api/v1/pop/queue/fan?consumerGroup={g}&wait=true&timeout=20000")
        for g in groups
    ]
    time.sleep(PARK)
    pushed_at = push(url, [item("fan", "p", n=2)])
    assert gather(polls, 25) == []
    for group, poll in zip(groups, polls, strict=True):
        assert poll.status == 200, group
        assert [m["data"] for m in poll.body["messages"]] == [{"n": 2}], group
        assert poll.done_at - pushed_at < PROMPT, group  # type: ignore[operator]


def test_a_poll_with_nothing_to_claim_answers_204_at_its_timeout(quiet_server):
    url = quiet_server.url
    started = time.monotonic()
    response = requests.get(f"{url}/api/v1/pop/queue/q?wait=true&timeout=700", timeout=10)
    elapsed = time.monotonic() - started
    assert response.status_code == 204
    assert 0.65 <= elapsed < 0.7 + PROMPT  # at its timeout, not the default 30 s

    # maxWaitTimeSeconds of the queue caps a longer timeout
    configure = {"queue": "capped", "options": {"maxWaitTimeSeconds": 1}}
    assert requests.post(f"{url}/api/v1/configure", json=configure, timeout=5).ok
    started = time.monotonic()
    response = requests.get(f"{url}/api/v1/pop/queue/capped?wait=true&timeout=60000", timeout=10)
    assert response.status_code == 204
    assert 0.95 <= time.monotonic() - started < 1.0 + PROMPT


def test_a_push_handled_by_one_worker_wakes_polls_parked_on_another(db_dsn):
    # The kernel picks which worker accepts a connection, and a loaded machine may give one
    # worker all of a round's: up to three rounds, until polls were parked in both.
    with servers(Server(db_dsn, workers=2, **NO_FALLBACK)) as (srv,):
        for round_ in range(3):
            queue = f"q{round_}"
            polls = []
            for i in range(n := 40):  # spaced out, so that both workers accept some
                polls.append(Poll(srv.port, f"/api/v1/pop/queue/{queue}/partition/p{i}?wait=true"))
                time.sleep(0.02)
            time.sleep(PARK)
            pushed_at = push(srv.url, [item(queue, f"p{i}") for i in range(n)])  # one worker
            assert gather(polls, 10) == []
            assert [p.status for p in polls] == [200] * n
            assert max(p.done_at for p in polls) - pushed_at < PROMPT  # type: ignore[type-var]
            workers = sql(db_dsn, storage.LEASE_HOLDERS_OF_QUEUE, (queue,))
            if len(workers) == 2:
                break
        assert len(workers) == 2  # polls were parked in both workers


def test_a_push_through_one_host_wakes_a_poll_parked_on_another(db_dsn):
    with servers(Server(db_dsn, **NO_FALLBACK), Server(db_dsn, **NO_FALLBACK)) as (a, b):
        poll = Poll(b.port, "/api/v1/pop/queue/q?wait=true&timeout=10000")
        time.sleep(PARK)
        pushed_at = push(a.url, [item()])
        assert gather([poll], 10) == []
        assert poll.status == 200
        assert poll.done_at - pushed_at < PROMPT  # type: ignore[operator]


def test_polls_still_wake_after_the_listen_connection_is_killed(quiet_server, db_dsn):
    (old,) = wait_for(lambda: listener_pids(db_dsn))
    parked = Poll(quiet_server.port, "/api/v1/pop/queue/q?wait=true&timeout=10000")
    time.sleep(PARK)

    sql(db_dsn, "SELECT pg_terminate_backend(%s)", (old,))
    pushed_at = push(quiet_server.url, [item()])  # its notification may well be lost
    assert gather([parked], 10) == []
    assert parked.status == 200  # woken when the listener came back
    assert parked.done_at - pushed_at < PROMPT + 2.0  # type: ignore[operator]

    (new,) = wait_for(lambda: listener_pids(db_dsn))
    assert new != old
    later = Poll(quiet_server.port, "/api/v1/pop/queue/q?wait=true&timeout=10000")
    time.sleep(PARK)
    pushed_at = push(quiet_server.url, [item(partition="again")])
    assert gather([later], 10) == []
    assert later.status == 200
    assert later.done_at - pushed_at < PROMPT  # type: ignore[operator]


def test_a_thousand_parked_polls_share_a_thousand_messages_exactly_once(db_dsn):
    """With the server's default settings. Each process hears all 1000 notifications but
    holds about half the polls, so it drops the wake-ups that find every poll of the route
    already woken (by design: a notification is a hint); a poll whose re-checks all lose
    their races parks again, and the fallback re-check serves it."""
    n = 1000
    with servers(Server(db_dsn, workers=2)) as (srv,):
        # (What is checked is that every poll gets one message; the minute each may take is
        # for a loaded 2-core machine, where a poll losing its races waits for fallbacks.)
        polls = [Poll(srv.port, "/api/v1/pop/queue/q?wait=true&timeout=60000") for _ in range(n)]
        time.sleep(2.0)
        push(srv.url, [item("q", f"p{i}", i=i) for i in range(n)])  # a partition each
        assert gather(polls, 65) == []
        assert sorted(p.status for p in polls) == [200] * n
        delivered = [t for p in polls for t in p.transaction_ids]
        assert len(delivered) == n and len(set(delivered)) == n
        assert statuses(db_dsn) == {"processing": n}


def test_sigterm_answers_parked_polls_at_once_and_leases_nothing_unanswered(quiet_server, db_dsn):
    polls = [
        Poll(quiet_server.port, f"/api/v1/pop/queue/q/partition/p{i}?wait=true&timeout=30000")
        for i in range(20)
    ]
    time.sleep(PARK + 0.5)
    assert quiet_server.proc is not None
    quiet_server.proc.terminate()
    stopped_at = time.monotonic()
    sql(db_dsn, storage.PUSH_ITEMS, (json.dumps([item("q", "p0")]),))
    assert gather(polls, 10) == []
    assert max(p.done_at for p in polls) - stopped_at < PROMPT  # type: ignore[type-var]
    assert {p.status for p in polls} <= {200, 204}
    quiet_server.proc.wait(15)
    delivered = sum(len(p.transaction_ids) for p in polls)
    assert statuses(db_dsn).get("processing", 0) == delivered


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_client_that_leaves_mid_poll_leaves_nothing_stuck(quiet_server, db_dsn, reset):
    url = quiet_server.url
    gone = [
        Poll(quiet_server.port, "/api/v1/pop/queue/q?wait=true&timeout=10000") for _ in range(3)
    ]
    time.sleep(PARK)
    for poll in gone:
        poll.abandon(reset=reset)
    stays = Poll(quiet_server.port, "/api/v1/pop/queue/q?wait=true&timeout=10000")
    time.sleep(PARK)

    pushed_at = push(url, [item()])
    assert gather([stays], 10) == []
    assert stays.status == 200  # the departed polls passed the wake-up on (no fallback here)
    assert stays.done_at - pushed_at < PROMPT  # type: ignore[operator]

    push(url, [item(partition="second")])
    time.sleep(0.5)
    assert statuses(db_dsn) == {"processing": 1, "pending": 1}
    response = requests.get(f"{url}/api/v1/pop/queue/q", timeout=5)
    assert response.status_code == 200
    assert response.json()["messages"][0]["retryCount"] == 0


def test_wakeups_resume_at_once_when_crash_recovery_emptied_the_worker_list(
    quiet_server, db_dsn
):
    """Crash recovery empties the unlogged queen.waiting_workers and ends every session;
    simulated here by emptying it and ending the listener's session."""
    (old,) = wait_for(lambda: listener_pids(db_dsn))
    parked = Poll(quiet_server.port, "/api/v1/pop/queue/q?wait=true&timeout=20000")
    wait_for(lambda: sql(db_dsn, "SELECT 1 FROM queen.waiting_workers"))

    sql(db_dsn, "TRUNCATE queen.waiting_workers")
    sql(db_dsn, "SELECT pg_terminate_backend(%s)", (old,))
    wait_for(lambda: [pid for pid in listener_pids(db_dsn) if pid != old])
    # Listed again on reconnect, not on the periodic refresh (10 s).
    wait_for(lambda: sql(db_dsn, "SELECT 1 FROM queen.waiting_workers"), timeout_s=PROMPT)
    time.sleep(PARK)  # the reconnect woke the poll once; let it park again
    pushed_at = push(quiet_server.url, [item()])
    assert gather([parked], 20) == []
    assert parked.status == 200
    assert parked.done_at - pushed_at < PROMPT  # type: ignore[operator]
