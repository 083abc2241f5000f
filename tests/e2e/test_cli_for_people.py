"""The CLI as people use it: quiet output, signals, tail's one shape, configure, groups
delete, apply and its exit codes, as subprocesses against a real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from queen.client import Queen
from tests.conftest import ROOT
from tests.e2e.servers import module_dsn, module_server, q
from tests.e2e.test_client_cli import ndjson, queen_cli

__all__ = ["module_dsn", "module_server", "q"]  # fixtures

STOP_WITHIN = 20  # seconds a signalled tail may take to end (a loaded 2-core machine)
TAIL_FIELDS = {"transactionId", "queue", "partition", "data", "createdAt", "retryCount"}


def test_quiet_by_default_and_verbose_on_request(module_server, q) -> None:
    queen_cli(module_server, "push", q, '{"n": 1}')
    quiet = queen_cli(module_server, "queues")
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = queen_cli(module_server, "queues", "-v")
    assert loud.returncode == 0 and "HTTP Request: GET" in loud.stderr


def start_tail(server, *args: str) -> subprocess.Popen[str]:
    """A `queen tail -f` started as a script's background job is: SIGINT ignored."""
    env = {**os.environ, "QUEEN_URL": server.url, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "queen.cli", "tail", *args, "-f", "--interval", "0.2"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("group", [None, "audit"])
def test_tail_f_ends_on_a_signal_when_sigint_was_ignored(module_server, q, signum, group):
    queen_cli(module_server, "push", q, '{"n": 1}')
    tail = start_tail(module_server, q, *(["--group", group] if group else []))
    try:
        assert json.loads(tail.stdout.readline())["data"] == {"n": 1}  # it runs
        tail.send_signal(signum)
        assert tail.wait(STOP_WITHIN) == 0
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    assert "Traceback" not in tail.stderr.read()
    tail.stdout.close()
    tail.stderr.close()


def test_tail_prints_one_shape_with_and_without_a_group(module_server, q) -> None:
    queen_cli(module_server, "push", q, "--partition", "eu", '{"n": 1}')
    (read,) = ndjson(queen_cli(module_server, "tail", q).stdout)
    (popped,) = ndjson(queen_cli(module_server, "tail", q, "--group", "g").stdout)
    assert set(read) == set(popped) == TAIL_FIELDS
    assert read == popped  # the same message, said the same way
    assert read["data"] == {"n": 1} and read["partition"] == "eu"


def test_usage_errors_exit_1(module_server) -> None:
    for args in (["dlq"], ["groups"], ["groups", "nope"], ["pop"], ["pop", "q", "-n", "x"]):
        done = queen_cli(module_server, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert "usage:" in done.stderr


def test_groups_delete(module_server, q) -> None:
    queen_cli(module_server, "push", q, '{"n": 1}')
    assert queen_cli(module_server, "tail", q, "--group", "audit").returncode == 0
    deleted = queen_cli(module_server, "groups", "delete", "audit", "--queue", q, "-o", "json")
    assert deleted.returncode == 0, deleted.stderr
    assert ndjson(deleted.stdout) == [{"group": "audit", "queue": q, "partitions": 1}]
    with Queen(module_server.url) as queen:
        assert queen.consumer_groups(q) == []
    again = queen_cli(module_server, "groups", "delete", "audit", "--queue", q)
    assert again.returncode == 1 and "HTTP 404" in again.stderr


def test_configure_from_flags_and_from_a_file(module_server, q, tmp_path) -> None:
    done = queen_cli(module_server, "configure", q, "--lease-time", "60", "--retry-limit", "5",
                     "--dlq-after-max-retries", "false", "-o", "json")
    assert done.returncode == 0, done.stderr
    options = {r["option"]: r["value"] for r in ndjson(done.stdout)}
    assert (options["leaseTime"], options["retryLimit"]) == (60, 5)
    assert options["dlqAfterMaxRetries"] is False
    path = tmp_path / "orders.yaml"
    path.write_text("namespace: shop\noptions:\n  leaseTime: 90\n  priority: 3\n")
    done = queen_cli(module_server, "configure", q, "-f", str(path), "--priority", "4")
    assert done.returncode == 0, done.stderr
    with Queen(module_server.url) as queen:
        stored = queen.queue(q)
    assert stored["namespace"] == "shop"
    assert (stored["options"]["leaseTime"], stored["options"]["priority"]) == (90, 4)  # flags win
    assert stored["options"]["retryLimit"] == 5  # left as it was
    path.write_text("options: {leaseTime: soon}\n")
    bad = queen_cli(module_server, "configure", q, "-f", str(path))
    assert bad.returncode == 1 and "leaseTime must be an integer" in bad.stderr
    assert queen_cli(module_server, "configure", q).returncode == 1  # nothing to set


QUEUES_FILE = """\
queues:
  {q}:
    namespace: shop
    options: {{leaseTime: 60, retryLimit: 5}}
    consumerGroups:
      billing: {{subscriptionMode: all}}
      audit: {{subscriptionMode: new}}
  {q}-out:
    consumerGroups: [archive]
"""


def test_apply_shows_the_diff_then_makes_it_once(module_server, q, tmp_path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES_FILE.format(q=q))
    with Queen(module_server.url) as queen:
        queen.push(q, [{"n": 1}])  # the queue exists, with its default options
    planned = queen_cli(module_server, "apply", str(path), "--dry-run")
    assert planned.returncode == 0, planned.stderr
    lines = planned.stdout.splitlines()
    assert f"~ {q} leaseTime: 300 -> 60" in lines
    assert f'~ {q} namespace: null -> "shop"' in lines
    assert f"+ queue {q}-out" in lines
    assert f"+ consumer group billing on {q} (subscriptionMode=all)" in lines
    assert f"+ consumer group archive on {q}-out (from all)" in lines
    with Queen(module_server.url) as queen:
        assert queen.queue(q)["options"]["leaseTime"] == 300  # a dry run changed nothing
        assert queen.consumer_groups(q) == []

    applied = queen_cli(module_server, "apply", str(path))
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines()[: len(lines)] == lines  # the diff first
    with Queen(module_server.url) as queen:
        stored = queen.queue(q)
        assert (stored["namespace"], stored["options"]["leaseTime"]) == ("shop", 60)
        groups = {g["name"]: g for g in queen.consumer_groups(q)}
        assert {n: g["subscriptionMode"] for n, g in groups.items()} == {
            "billing": "all", "audit": "new"}
        assert groups["billing"]["pending"] == 1  # subscribed from the oldest message
        assert [g["name"] for g in queen.consumer_groups(f"{q}-out")] == ["archive"]
        (got,) = queen.pop(q, group="billing")
        assert got.data == {"n": 1}

    again = queen_cli(module_server, "apply", str(path))
    assert (again.returncode, again.stdout) == (0, "nothing to change\n")
    path.write_text(QUEUES_FILE.format(q=q).replace("leaseTime: 60", "leaseTime: 90"))
    changed = queen_cli(module_server, "apply", str(path))
    assert changed.stdout.splitlines()[0] == f"~ {q} leaseTime: 60 -> 90"


def test_apply_refuses_a_bad_file_and_changes_nothing(module_server, q, tmp_path) -> None:
    path = tmp_path / "queues.yaml"
    for text, said in (
        ("queues: [a, b]\n", "mapping `queues:`"),
        (f"queues:\n  {q}:\n    options: {{leaseTme: 5}}\n", "unknown option 'leaseTme'"),
        (f"queues:\n  {q}:\n    consumerGroups: {{g: {{mode: new}}}}\n", "subscriptionMode"),
        ("queues: {a: [\n", "not YAML"),
    ):
        path.write_text(text)
        done = queen_cli(module_server, "apply", str(path))
        assert done.returncode == 1 and said in done.stderr, (text, done.stderr)
    bad_name = f"queues:\n  {q}:\n    consumerGroups: [bad group]\n"
    path.write_text(bad_name)
    done = queen_cli(module_server, "apply", str(path))
    assert done.returncode == 1 and "HTTP 400" in done.stderr
    assert queen_cli(module_server, "apply", str(tmp_path / "none.yaml")).returncode == 1


def test_subscribe_route(module_server, q) -> None:
    import requests

    url = f"{module_server.url}/api/v1/consumer-groups"
    with Queen(module_server.url) as queen:
        queen.push(q, [{"n": 1}])
    first = requests.put(f"{url}/g", json={"queue": q, "subscriptionMode": "new"}, timeout=30)
    assert first.status_code == 201 and first.json()["created"] is True
    again = requests.put(f"{url}/g", json={"queue": q, "subscriptionMode": "all"}, timeout=30)
    assert again.status_code == 200 and again.json()["created"] is False
    with Queen(module_server.url) as queen:
        (g,) = queen.consumer_groups(q)
        assert g["subscriptionMode"] == "new"  # the first subscription holds
        assert queen.pop(q, group="g") == []  # it started after the message
    for body, status in (
        ({"queue": f"{q}-none"}, 404),
        ({"queue": q, "subscriptionMode": "soon"}, 400),
        ({"queue": q, "subscriptionMode": 1}, 400),
        ({}, 400),
    ):
        resp = requests.put(f"{url}/g2", json=body, timeout=30)
        assert resp.status_code == status, (body, resp.text)
    assert requests.put(f"{url}/__queue__", json={"queue": q}, timeout=30).status_code == 400
