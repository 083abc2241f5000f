"""`queen push | pop | tail | stats | queues | dlq | groups` as subprocesses against a real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from queen.client import Queen
from tests.conftest import ROOT, free_port
from tests.e2e.servers import fresh_server

__all__ = ["fresh_server"]  # a fixture


def queen_cli(server, *args: str, stdin: str | None = None, url: str | None = None):
    env = {**os.environ, "QUEEN_URL": url or server.url, "PYTHONPATH": str(ROOT)}
    env.pop("QUEEN_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "queen.cli", *args], input=stdin, env=env,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def ndjson(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_push_arguments_and_stdin_then_pop_and_ack(server):
    pushed = queen_cli(server, "push", "orders", "--partition", "eu", '{"id": 1}', '{"id": 2}')
    assert pushed.returncode == 0, pushed.stderr
    assert [r["status"] for r in ndjson(pushed.stdout)] == ["queued", "queued"]
    piped = queen_cli(server, "push", "orders", stdin='{"id": 3}\n\n{"id": 4}\n')
    assert piped.returncode == 0 and len(ndjson(piped.stdout)) == 2

    popped = queen_cli(server, "pop", "orders", "-n", "10", "--ack")
    assert popped.returncode == 0, popped.stderr
    messages = ndjson(popped.stdout)
    assert sorted(m["data"]["id"] for m in messages) in ([1, 2], [3, 4])  # one partition
    again = queen_cli(server, "pop", "orders", "-n", "10", "--ack")
    assert again.returncode == 0 and len(ndjson(again.stdout)) == 2
    empty = queen_cli(server, "pop", "orders")
    assert empty.returncode == 4 and empty.stdout == ""
    with Queen(server.url) as queen:
        assert len(queen.messages("orders", status="completed")) == 4


def test_pop_without_ack_leaves_the_message_leased(server):
    queen_cli(server, "push", "leased", '{"n": 1}')
    popped = queen_cli(server, "pop", "leased", "-o", "table")
    assert popped.returncode == 0
    assert popped.stdout.splitlines()[0].split()[:2] == ["TRANSACTION", "ID"]
    with Queen(server.url) as queen:
        assert len(queen.messages("leased", status="processing")) == 1


def test_bad_input_exits_1(server):
    bad_json = queen_cli(server, "push", "q", "{not json")
    assert bad_json.returncode == 1 and "not JSON" in bad_json.stderr
    nothing = queen_cli(server, "push", "q", stdin="")
    assert nothing.returncode == 1
    bad_name = queen_cli(server, "push", "bad queue name", '{"a": 1}')  # the server's 400
    assert bad_name.returncode == 1 and "HTTP 400" in bad_name.stderr
    usage = queen_cli(server, "pop", "q", "-n", "many")
    assert usage.returncode == 1
    unknown = queen_cli(server, "stats", "no-such-queue")
    assert unknown.returncode == 1 and "HTTP 404" in unknown.stderr


def test_an_unreachable_server_exits_2(server):
    down = queen_cli(server, "queues", url=f"http://127.0.0.1:{free_port()}")
    assert down.returncode == 2
    assert "cannot connect" in down.stderr


def test_stats_and_queues_print_tables_or_json(server):
    queen_cli(server, "push", "stats-q", "--partition", "a", '{"n": 1}', '{"n": 2}')
    queen_cli(server, "push", "stats-q", "--partition", "b", '{"n": 3}')
    queues = queen_cli(server, "queues")
    assert queues.returncode == 0
    header, *rows = queues.stdout.splitlines()
    assert header.split()[:3] == ["QUEUE", "PARTITIONS", "PENDING"]
    assert rows[0].split()[:3] == ["stats-q", "2", "3"]

    stats = queen_cli(server, "stats", "stats-q")
    assert stats.returncode == 0
    lines = [line.split() for line in stats.stdout.splitlines()]
    assert lines[0][0] == "PARTITION"
    assert {(cells[0], cells[1]) for cells in lines[1:]} == {("a", "2"), ("b", "1"), ("(all)", "3")}

    as_json = ndjson(queen_cli(server, "stats", "-o", "json").stdout)
    assert [(q["name"], q["pending"]) for q in as_json] == [("stats-q", 3)]


def test_dlq_list_and_retry(server):
    with Queen(server.url) as queen:
        queen.configure("dlq-q", retry_limit=0)
        (pushed,) = queen.push("dlq-q", [{"n": 1}])
        (message,) = queen.pop("dlq-q")
        queen.ack(message, error="it broke")
    listed = queen_cli(server, "dlq", "list", "dlq-q", "-o", "json")
    assert listed.returncode == 0
    (dead,) = ndjson(listed.stdout)
    assert dead["transactionId"] == pushed.transaction_id and dead["errorMessage"] == "it broke"
    table = queen_cli(server, "dlq", "list", "dlq-q")
    assert "it broke" in table.stdout
    retried = queen_cli(server, "dlq", "retry", "dlq-q")
    assert retried.returncode == 0 and pushed.transaction_id in retried.stdout
    assert queen_cli(server, "dlq", "list", "dlq-q", "-o", "json").stdout == ""
    popped = ndjson(queen_cli(server, "pop", "dlq-q").stdout)
    assert popped[0]["transactionId"] == pushed.transaction_id


def test_tail_prints_the_latest_messages_oldest_first_and_follows(server):
    queen_cli(server, "push", "tailed", '{"n": 1}', '{"n": 2}', '{"n": 3}')
    tail = queen_cli(server, "tail", "tailed", "-n", "2")
    assert tail.returncode == 0
    assert [m["data"]["n"] for m in ndjson(tail.stdout)] == [2, 3]

    env = {**os.environ, "QUEEN_URL": server.url, "PYTHONPATH": str(ROOT)}
    follower = subprocess.Popen(
        [sys.executable, "-m", "queen.cli", "tail", "tailed", "-f", "--interval", "0.2"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        seen = [json.loads(follower.stdout.readline())["data"]["n"] for _ in range(3)]
        assert seen == [1, 2, 3]
        queen_cli(server, "push", "tailed", '{"n": 4}')
        assert json.loads(follower.stdout.readline())["data"]["n"] == 4
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(20) == 0
    time.sleep(0)  # (the follower read only: nothing was consumed)
    with Queen(server.url) as queen:
        assert len(queen.messages("tailed", status="pending")) == 4


def test_groups_list_and_seek_and_tail_as_a_group(fresh_server):
    server = fresh_server

    queen_cli(server, "push", "grouped", '{"n": 1}')
    tail = queen_cli(server, "tail", "grouped", "--group", "audit")
    assert [m["data"]["n"] for m in ndjson(tail.stdout)] == [1]
    listed = queen_cli(server, "groups", "list", "-o", "json")
    assert any(g["name"] == "audit" for g in ndjson(listed.stdout))
    sought = queen_cli(server, "groups", "seek", "audit", "grouped", "--to", "beginning")
    assert sought.returncode == 0
    assert len(ndjson(queen_cli(server, "tail", "grouped", "--group", "audit").stdout)) == 1
