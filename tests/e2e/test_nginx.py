"""Two hosts behind a real nginx, configured exactly as docs/DEPLOY.md says."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests import storage
from tests.conftest import ROOT, Server, cloned_database, free_port, wait_until_healthy
from tests.e2e.polls import Poll, gather
from tests.e2e.test_long_poll import NO_FALLBACK, PARK, PROMPT, item, push, servers
from tests.e2e.test_long_poll import sql as sql_rows

NGINX = Path("/usr/sbin/nginx")
pytestmark = pytest.mark.skipif(not NGINX.exists(), reason="nginx is not installed")

DOCUMENTED_HOSTS = ("10.0.0.11:6632", "10.0.0.12:6632")


def documented_config() -> str:
    """The first ```nginx block of docs/DEPLOY.md."""
    text = (ROOT / "docs" / "DEPLOY.md").read_text()
    match = re.search(r"```nginx\n(.*?)```", text, re.DOTALL)
    assert match, "docs/DEPLOY.md has no nginx block"
    return match.group(1)


def nginx_conf(workdir: Path, port: int, hosts: tuple[Server, ...]) -> str:
    """Wrap the documented http-context snippet in a main context of our own."""
    snippet = documented_config()
    for documented, srv in zip(DOCUMENTED_HOSTS, hosts, strict=True):
        assert documented in snippet
        snippet = snippet.replace(documented, f"127.0.0.1:{srv.port}")
    assert "listen 80;" in snippet
    snippet = snippet.replace("listen 80;", f"listen 127.0.0.1:{port};")
    user = "user root;\n" if os.geteuid() == 0 else ""  # temp dirs are private to us
    temp = " ".join(
        f"{kind}_temp_path {workdir / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return (
        f"{user}worker_processes 1;\npid {workdir / 'nginx.pid'};\n"
        f"error_log {workdir / 'error.log'} warn;\n"
        "events { worker_connections 1024; }\n"
        f"http {{\naccess_log off;\n{temp}\n{snippet}\n}}\n"
    )


@pytest.fixture(scope="module")
def balanced_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """One database for the whole module (each test uses queues of its own)."""
    with cloned_database(server_dsn, template_db, "queen_nginx") as dsn:
        yield dsn


@contextlib.contextmanager
def nginx_before(hosts: tuple[Server, ...], workdir: Path) -> Iterator[tuple[str, int]]:
    """Run nginx with the documented configuration before started hosts; yield (url, port)."""
    port = free_port()
    conf = workdir / "nginx.conf"
    conf.write_text(nginx_conf(workdir, port, hosts))
    command = [str(NGINX), "-p", str(workdir), "-c", str(conf), "-e", str(workdir / "error.log")]
    subprocess.run([*command, "-t", "-q"], check=True, capture_output=True)
    proc = subprocess.Popen([*command, "-g", "daemon off;"])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, 10, lambda: "nginx did not come up")
        yield url, port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def balanced(
    balanced_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int, str]]:
    """Two hosts (one worker each) and nginx before them; yields (url, port, dsn)."""
    hosts = (Server(balanced_dsn, **NO_FALLBACK), Server(balanced_dsn, **NO_FALLBACK))
    with servers(*hosts), nginx_before(hosts, tmp_path_factory.mktemp("nginx")) as (url, port):
        yield url, port, balanced_dsn


def queue_rows(dsn: str, queue: str) -> list[tuple[object, ...]]:
    return sql_rows(dsn, storage.QUEUE_MESSAGES, (queue,))


def test_long_polls_through_nginx_are_woken_by_pushes_through_nginx(balanced):
    url, port, dsn = balanced
    answered_by = []
    for round_ in range(3):  # nginx alternates between the hosts, as a rule: see below
        queue = f"woken{round_}"
        polls = []
        for i in range(n := 10):
            path = f"/api/v1/pop/queue/{queue}/partition/p{i}?wait=true&timeout=20000"
            polls.append(Poll(port, path))
        time.sleep(PARK + 0.5)
        pushed_at = push(url, [item(queue, f"p{i}") for i in range(n)])
        assert gather(polls, 15) == []
        assert [p.status for p in polls] == [200] * n
        assert max(p.done_at for p in polls) - pushed_at < PROMPT  # type: ignore[type-var]
        answered_by.append(len({row[2] for row in queue_rows(dsn, queue)}))
        if answered_by[-1] == 2:
            break
    # Once in a full run on a loaded machine nginx sent all ten polls to one host; a round
    # in which both hosts answered shows the pushes' wake-ups crossing between them.
    assert 2 in answered_by, answered_by


def test_an_empty_long_poll_through_nginx_answers_204_at_its_timeout(balanced):
    url, _, _ = balanced
    started = time.monotonic()
    response = requests.get(f"{url}/api/v1/pop/queue/empty?wait=true&timeout=1500", timeout=10)
    assert response.status_code == 204
    assert 1.4 <= time.monotonic() - started < 1.5 + PROMPT


def test_a_client_leaving_a_poll_through_nginx_leaves_nothing_stuck(balanced):
    url, port, dsn = balanced
    gone = [Poll(port, "/api/v1/pop/queue/left?wait=true&timeout=20000") for _ in range(2)]
    time.sleep(PARK)
    for poll in gone:
        poll.abandon()
    time.sleep(0.3)  # nginx closes its connections to the hosts
    push(url, [item("left")])
    time.sleep(0.5)
    assert queue_rows(dsn, "left") == [("pending", 0, None)]


def test_the_dashboard_websocket_upgrades_through_nginx(balanced):
    import websocket

    _, port, _ = balanced
    ws = websocket.create_connection(f"ws://127.0.0.1:{port}/ws/dashboard", timeout=5)
    try:
        assert ws.connected
    finally:
        ws.close()


def test_nginx_never_retries_a_pop_on_another_host(db_dsn: str, tmp_path: Path) -> None:
    """A pop has side effects (it leases): after an upstream error nginx answers it, it does
    not send it to the next host. Reads that change nothing may still fail over."""
    hosts = (Server(db_dsn), Server(db_dsn))
    with servers(*hosts), nginx_before(hosts, tmp_path) as (url, _):
        push(url, [item("retried", f"p{i}") for i in range(4)])
        hosts[1].stop()
        pops = [requests.get(f"{url}/api/v1/pop/queue/retried", timeout=10) for _ in range(4)]
        assert 502 in [r.status_code for r in pops]  # round robin reached the stopped host
        assert {r.status_code for r in pops} <= {200, 502}
        reads = [requests.get(f"{url}/health", timeout=10) for _ in range(4)]
        assert [r.status_code for r in reads] == [200] * 4  # failed over to the live host
