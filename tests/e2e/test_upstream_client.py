"""The original project's Python client, `queen-mq` 0.15.0 from PyPI, against a real gunicorn.

Its package is named `queen` too, so it lives in a virtualenv of its own (.venv-queen-mq
at the repository root, made on first use) and runs its README flows there
(tests/e2e/upstream_flows.py). Each flow's answers are checked here, and so is what the
server holds after it: every message completed (or dead-lettered, or deleted) as the flow
asked, no lease left live, and nothing delivered again.

What that client does that our API does not honour is named here and in docs/CLIENT.md.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from tests.conftest import ROOT, Server

UPSTREAM = "queen-mq==0.15.0"
VENV = ROOT / ".venv-queen-mq"
FLOWS = Path(__file__).with_name("upstream_flows.py")
API = "/api/v1"


def upstream_python() -> Path:
    """The interpreter of a virtualenv holding the pinned upstream client (made once)."""
    python = VENV / "bin" / "python"
    with open(ROOT / ".venv-queen-mq.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (VENV / "installed").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 UPSTREAM],
                check=True, timeout=300,
            )
            (VENV / "installed").write_text(UPSTREAM)
    return python


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory, server_dsn: str,
            template_db: str) -> Iterator[tuple[dict[str, Any], Server, str, str]]:
    """Run every flow once against one server; yield (outcomes, server, dsn, prefix)."""
    from tests.conftest import cloned_database

    python = upstream_python()
    with cloned_database(server_dsn, template_db) as dsn:
        srv = Server(dsn).start()
        try:
            prefix = f"up{uuid.uuid4().hex[:8]}"
            done = subprocess.run(
                [str(python), "-P", str(FLOWS), srv.url, prefix],
                capture_output=True, text=True, timeout=240,
                cwd=tmp_path_factory.mktemp("upstream"),  # (no `queen` of ours in sight)
            )
            assert done.returncode == 0, done.stderr[-3000:]
            last = done.stdout.strip().splitlines()[-1]  # (the client prints as it goes)
            yield json.loads(last), srv, dsn, prefix
        finally:
            srv.stop()


def flow(outcome: tuple[dict[str, Any], Server, str, str], name: str) -> dict[str, Any]:
    result = outcome[0][name]
    assert result["ok"], f"{name}: {result.get('error')}\n{result.get('trace')}"
    return result


def live_leases(dsn: str, queue: str) -> int:
    with psycopg.connect(dsn) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM queen.consumers c"
            " JOIN queen.partitions p ON p.id = c.partition_id"
            " JOIN queen.queues q ON q.id = p.queue_id"
            " WHERE q.name = %s AND c.lease_id IS NOT NULL",
            [queue],
        ).fetchone()
    return int(count)


def statuses(srv: Server, queue: str) -> list[str]:
    """Queue mode's status of each message of queue (API.md 6.1)."""
    resp = requests.get(f"{srv.url}{API}/messages", params={"queue": queue}, timeout=10)
    assert resp.status_code == 200, resp.text
    return sorted(m["status"] for m in resp.json()["messages"])


def nothing_left(srv: Server, queue: str, group: str | None = None) -> bool:
    """A pop now (no waiting) finds nothing: no message pending or delivered again."""
    params = {"wait": "false", "batch": "100"}
    if group is not None:
        params["consumerGroup"] = group
    resp = requests.get(f"{srv.url}{API}/pop/queue/{queue}", params=params, timeout=10)
    return resp.status_code == 204


def test_push_pop_and_acks_one_by_one_and_as_a_batch(outcome: Any) -> None:
    result = flow(outcome, "push_pop_ack")
    srv, dsn, q = outcome[1], outcome[2], f"{outcome[3]}-push_pop_ack"
    assert result["popped"] == 4
    # Popped messages carry their partition's id, which the client requires to ack.
    (partition,) = requests.get(f"{srv.url}{API}/resources/queues/{q}", timeout=10).json()[
        "partitions"
    ]
    assert result["partitionIds"] == [partition["id"]] * 4
    assert [a["success"] for a in result["single"]] == [True, True]
    assert result["batch"]["success"] is True
    assert [r["success"] for r in result["batch"]["results"]["results"]] == [True, True]
    assert statuses(srv, q) == ["completed"] * 4
    assert live_leases(dsn, q) == 0
    assert nothing_left(srv, q)


def test_consume_loop_in_queue_mode_acks_every_message(outcome: Any) -> None:
    result = flow(outcome, "consume_queue")
    srv, dsn, q = outcome[1], outcome[2], f"{outcome[3]}-consume_queue"
    assert result["seen"] == [0, 1, 2, 3, 4]
    assert statuses(srv, q) == ["completed"] * 5
    assert live_leases(dsn, q) == 0
    assert nothing_left(srv, q)


def test_consume_loops_in_two_groups_each_see_every_message(outcome: Any) -> None:
    result = flow(outcome, "consume_groups")
    srv, dsn, q = outcome[1], outcome[2], f"{outcome[3]}-consume_groups"
    assert result["seen"] == {"g1": [0, 1, 2, 3], "g2": [0, 1, 2, 3]}
    assert live_leases(dsn, q) == 0
    assert nothing_left(srv, q, "g1") and nothing_left(srv, q, "g2")


def test_group_batch_ack_applies_the_bodys_consumer_group(outcome: Any) -> None:
    """The client names the group once, at the top of the batch: every item is acked in
    it (not answered lease_expired while the messages stay leased)."""
    result = flow(outcome, "group_batch_ack")
    srv, dsn, q = outcome[1], outcome[2], f"{outcome[3]}-group_batch_ack"
    assert result["popped"] == 3
    items = result["answer"]["results"]["results"]
    assert [(i["status"], i["success"]) for i in items] == [("completed", True)] * 3
    assert live_leases(dsn, q) == 0
    assert nothing_left(srv, q, "audit")
    assert statuses(srv, q) == ["pending"] * 3  # (queue mode has not consumed them)


def test_transaction_answers_success_and_applies_both_operations(outcome: Any) -> None:
    result = flow(outcome, "transaction")
    srv, dsn, q = outcome[1], outcome[2], f"{outcome[3]}-transaction"
    assert result["answer"]["success"] is True and result["answer"]["committed"] is True
    assert statuses(srv, f"{q}-in") == ["completed"]
    assert live_leases(dsn, f"{q}-in") == 0
    resp = requests.get(f"{srv.url}{API}/messages", params={"queue": f"{q}-out"}, timeout=10)
    assert [m["payload"] for m in resp.json()["messages"]] == [{"step": 2}]


def test_renew_reports_the_new_expiry(outcome: Any) -> None:
    result = flow(outcome, "renew")
    srv, dsn, q = outcome[1], outcome[2], f"{outcome[3]}-renew"
    answer = result["answer"]
    assert answer["success"] is True
    assert answer["newExpiresAt"] is not None and answer["newExpiresAt"] >= result["before"]
    assert statuses(srv, q) == ["completed"]
    assert live_leases(dsn, q) == 0


def test_dead_letters_are_listed(outcome: Any) -> None:
    result = flow(outcome, "dead_letters")
    srv, dsn, q = outcome[1], outcome[2], f"{outcome[3]}-dead_letters"
    assert result["failed"]["status"] == "dead_letter"
    listed = result["listed"]
    assert listed["total"] == 1
    (message,) = listed["messages"]
    assert message["transactionId"] == result["transactionId"]
    assert message["errorMessage"] == "boom"
    assert statuses(srv, q) == ["dead_letter"]
    assert live_leases(dsn, q) == 0


def test_queue_delete_removes_the_queue_and_its_messages(outcome: Any) -> None:
    result = flow(outcome, "delete")
    srv, dsn, q = outcome[1], outcome[2], f"{outcome[3]}-delete"
    assert result["answer"]["deleted"] is True
    assert requests.get(f"{srv.url}{API}/resources/queues/{q}", timeout=10).status_code == 404
    with psycopg.connect(dsn) as conn:
        (left,) = conn.execute(
            "SELECT count(*) FROM queen.messages m JOIN queen.partitions p"
            " ON p.id = m.partition_id JOIN queen.queues x ON x.id = p.queue_id"
            " WHERE x.name = %s",
            [q],
        ).fetchone()
    assert left == 0


def test_duplicate_callback_is_not_honoured_but_the_duplicate_is_stored_once(
    outcome: Any,
) -> None:
    """Not honoured: the client's on_duplicate expects the push answer to be a bare array;
    API.md's push answers {"messages": [...]} (each item's status says "duplicate"), and
    our contract wins (docs/CLIENT.md)."""
    result = flow(outcome, "duplicates")
    srv, q = outcome[1], f"{outcome[3]}-duplicates"
    assert result["callbacks"] == []
    assert statuses(srv, q) == ["pending"]


def test_the_flows_run_from_their_own_virtualenv() -> None:
    """The flows import the upstream client, never ours (both are the package `queen`)."""
    python = upstream_python()
    where = subprocess.run(
        [str(python), "-P", "-c", "import queen; print(queen.__file__)"],
        capture_output=True, text=True, check=True, cwd=os.path.dirname(FLOWS),
    ).stdout
    assert str(VENV) in where
