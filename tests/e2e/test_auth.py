"""QUEEN_AUTH=on against a real gunicorn with two workers: tokens made and revoked with the
CLI, the dashboard's socket and data, CORS origins, and the protected-mode refusal."""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import requests
import websocket

from queen import cli
from tests.conftest import ROOT, Server, cloned_database, free_port

ORIGIN = "https://ops.example"
REVOKE_BOUND_S = 1.0  # a revoked token must be refused on every worker after this


def queen(dsn: str, *argv: str) -> tuple[int, str, str]:
    """Run `queen ...` in this process against dsn; return its status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DATABASE_URL", dsn)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(list(argv))
            except SystemExit as exc:
                status = int(exc.code or 0)
    return status, out.getvalue(), err.getvalue()


def create(dsn: str, role: str, name: str, *extra: str) -> str:
    status, out, err = queen(dsn, "token", "create", "--role", role, "--name", name, *extra)
    assert status == 0, err
    token = out.rstrip("\n").splitlines()[-1]
    assert token.startswith("qn_") and len(token) == 46
    return token


@pytest.fixture(scope="module")
def auth_db(server_dsn: str, template_db: str) -> Iterator[str]:
    with cloned_database(server_dsn, template_db, "queen_auth") as dsn:
        yield dsn


@pytest.fixture(scope="module")
def secured(auth_db: str) -> Iterator[Server]:
    srv = Server(
        auth_db,
        workers=2,
        QUEEN_AUTH="on",
        QUEEN_CORS_ORIGINS=f"{ORIGIN}, https://other.example",
        QUEEN_DASHBOARD_STATS_INTERVAL="0.5",
    ).start()
    yield srv
    srv.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_json_error(resp: requests.Response, status: int) -> None:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["Content-Type"].startswith("application/json")
    assert set(resp.json()) == {"error"}


def test_token_cli_creates_lists_and_revokes(auth_db: str) -> None:
    status, out, _ = queen(auth_db, "token", "create", "--role", "reader")
    assert status == 0
    lines = out.strip().splitlines()
    assert lines[-1].startswith("qn_")
    status, listed, _ = queen(auth_db, "token", "list")
    assert status == 0
    assert lines[-1] not in listed  # the token itself is never shown again
    name = lines[0].split()[1].rstrip(":")
    assert f"{name}\treader\t*\t-\t" in listed
    assert queen(auth_db, "token", "revoke", name)[0] == 0
    status, _, err = queen(auth_db, "token", "revoke", name)
    assert (status, err) == (2, f"queen: no active token named {name!r}\n")
    assert "revoked" in queen(auth_db, "token", "list")[1]
    status, _, err = queen(auth_db, "token", "create", "--role", "reader", "--name", name)
    assert status == 2 and "exists already" in err
    status, _, err = queen(auth_db, "token", "create", "--role", "root")
    assert status == 2 and "invalid choice" in err
    status, _, err = queen(auth_db, "token", "create", "--role", "reader", "--rate", "0")
    assert status == 2 and "positive" in err


def test_requests_without_a_token_are_refused(secured: Server) -> None:
    for path in ("/api/v1/resources/overview", "/api/v1/openapi.json", "/metrics"):
        resp = requests.get(secured.url + path, timeout=10)
        assert_json_error(resp, 401)
        assert resp.headers["WWW-Authenticate"] == "Bearer"
    resp = requests.post(
        f"{secured.url}/api/v1/push",
        json={"items": [{"queue": "q", "payload": 1}]},
        headers={"Authorization": "Bearer qn_" + "x" * 10_000},
        timeout=10,
    )
    assert_json_error(resp, 401)
    assert requests.get(f"{secured.url}/health", timeout=10).status_code == 200
    assert requests.get(f"{secured.url}/metrics/prometheus", timeout=10).status_code == 200
    assert requests.get(f"{secured.url}/dashboard", timeout=10).status_code == 200
    assert requests.get(f"{secured.url}/dashboard/static/app.js", timeout=10).status_code == 200


def test_dashboard_data_needs_a_token(secured: Server, auth_db: str) -> None:
    url = f"{secured.url}/api/v1/analytics/throughput"
    assert_json_error(requests.get(url, timeout=10), 401)
    token = create(auth_db, "reader", "dash-reader")
    assert requests.get(url, headers=bearer(token), timeout=10).status_code == 200


def close_code(ws: websocket.WebSocket) -> tuple[int, str]:
    """Read frames until the server's close; return its code and reason."""
    while True:
        opcode, frame = ws.recv_data_frame(True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            (code,) = struct.unpack("!H", frame.data[:2])
            return code, frame.data[2:].decode()


@pytest.mark.parametrize(
    ("query", "code"),
    [("", 4401), ("?token=", 4401), ("?token=qn_nope", 4401), ("?token=SCOPED", 4403)],
    ids=["none", "empty", "unknown", "scoped"],
)
def test_the_socket_refuses_without_a_usable_token(
    secured: Server, auth_db: str, query: str, code: int
) -> None:
    if "SCOPED" in query:
        query = "?token=" + create(auth_db, "reader", f"ws-scoped-{code}", "--queues", "a-*")
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{secured.port}/ws/dashboard{query}", timeout=5
    )
    try:
        got, reason = close_code(ws)
    finally:
        ws.close()
    assert got == code
    assert reason


def test_the_socket_serves_a_reader(secured: Server, auth_db: str) -> None:
    token = create(auth_db, "reader", "ws-reader")
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{secured.port}/ws/dashboard?token={token}", timeout=5
    )
    try:
        names = [json.loads(ws.recv())["event"] for _ in range(2)]
    finally:
        ws.close()
    assert "client.connected" in names, names


def pinned_sessions(url: str, token: str, workers: int, tries: int = 60) -> list[requests.Session]:
    """Open keep-alive sessions until each worker holds one (told apart by /metrics' pid)."""
    pinned: dict[int, requests.Session] = {}
    for _ in range(tries):
        session = requests.Session()
        resp = session.get(f"{url}/metrics", headers=bearer(token), timeout=10)
        assert resp.status_code == 200, resp.text
        pid = resp.json()["process"]["pid"]
        if pid in pinned:
            session.close()
        else:
            pinned[pid] = session
        if len(pinned) == workers:
            return list(pinned.values())
    pytest.fail(f"reached {len(pinned)} of {workers} workers")


def test_a_revoked_token_stops_on_every_worker_within_a_second(
    secured: Server, auth_db: str
) -> None:
    token = create(auth_db, "reader", "revoked-mid-run")
    sessions = pinned_sessions(secured.url, token, workers=2)
    for session in sessions:  # each worker has the token cached now
        assert session.get(f"{secured.url}/metrics", headers=bearer(token), timeout=10).ok
    assert queen(auth_db, "token", "revoke", "revoked-mid-run")[0] == 0
    time.sleep(REVOKE_BOUND_S)
    for session in sessions:
        resp = session.get(f"{secured.url}/metrics", headers=bearer(token), timeout=10)
        assert_json_error(resp, 401)
        session.close()


def test_a_rate_limited_token_gets_429(secured: Server, auth_db: str) -> None:
    token = create(auth_db, "reader", "limited", "--rate", "2")
    with requests.Session() as session:  # one connection: one worker's bucket
        started = time.monotonic()
        statuses = []
        for _ in range(20):
            resp = session.get(f"{secured.url}/metrics", headers=bearer(token), timeout=10)
            statuses.append(resp.status_code)
            if resp.status_code == 429:
                assert int(resp.headers["Retry-After"]) >= 1
                assert set(resp.json()) == {"error"}
        elapsed = time.monotonic() - started
    allowed = statuses.count(200)
    assert allowed + statuses.count(429) == 20
    assert allowed <= 2 + 2 * elapsed + 1, (statuses, elapsed)


def test_a_producer_push_records_its_name(secured: Server, auth_db: str) -> None:
    producer = create(auth_db, "producer", "billing-service", "--queues", "billing-*")
    reader = create(auth_db, "reader", "auditor")
    url = f"{secured.url}/api/v1"
    item = {"queue": "billing-eu", "payload": {"n": 1}, "transactionId": "bill-1"}
    resp = requests.post(
        f"{url}/push", json={"items": [item]}, headers=bearer(producer), timeout=10
    )
    assert resp.status_code == 201, resp.text
    other = {"queue": "payroll", "payload": 1}
    resp = requests.post(
        f"{url}/push", json={"items": [other]}, headers=bearer(producer), timeout=10
    )
    assert_json_error(resp, 403)
    resp = requests.post(
        f"{url}/push",
        data=json.dumps({"items": [item]}),
        headers={**bearer(producer), "Content-Type": "text/plain"},
        timeout=10,
    )
    assert_json_error(resp, 415)
    doc = requests.get(f"{url}/messages/bill-1", headers=bearer(reader), timeout=10).json()
    assert doc["producer"] == "billing-service"
    resp = requests.delete(f"{url}/messages/bill-1", headers=bearer(reader), timeout=10)
    assert_json_error(resp, 403)


def test_cors_answers_only_the_listed_origins(secured: Server) -> None:
    preflight = {"Access-Control-Request-Method": "POST"}
    ok = requests.options(
        f"{secured.url}/api/v1/push", headers={"Origin": ORIGIN, **preflight}, timeout=10
    )
    assert ok.status_code == 204
    assert ok.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "Origin" in ok.headers["Vary"]
    assert "Authorization" in ok.headers["Access-Control-Allow-Headers"]
    other = requests.options(
        f"{secured.url}/api/v1/push",
        headers={"Origin": "https://evil.example", **preflight},
        timeout=10,
    )
    assert "Access-Control-Allow-Origin" not in other.headers
    assert "Origin" in other.headers["Vary"]


def gunicorn(host: str, **env: str) -> subprocess.Popen[bytes]:
    environ = {k: v for k, v in os.environ.items() if k != "QUEEN_AUTH"}
    environ.update(HOST=host, PORT=str(free_port()), QUEEN_WORKERS="1", LOG_LEVEL="warning", **env)
    return subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py")],
        env=environ,
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )


def test_gunicorn_refuses_an_open_non_loopback_address(db_dsn: str) -> None:
    proc = gunicorn("0.0.0.0", DATABASE_URL=db_dsn)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    lines = err.decode().strip().splitlines()
    assert lines == [lines[-1]] and "refusing to listen on 0.0.0.0" in lines[-1], lines


def test_gunicorn_serves_open_when_auth_off_is_explicit(db_dsn: str) -> None:
    srv = Server(db_dsn, HOST="0.0.0.0", QUEEN_AUTH="off")
    srv.env["HOST"] = "0.0.0.0"
    try:
        srv.start()
        assert requests.get(f"{srv.url}/api/v1/resources/overview", timeout=10).status_code == 200
    finally:
        srv.stop()


def test_serve_refuses_an_open_non_loopback_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUEEN_AUTH", raising=False)
    status, _, err = queen("postgresql://nobody@127.0.0.1:1/none", "serve", "--host", "0.0.0.0")
    assert status == 2
    assert err.startswith("queen: refusing to listen on 0.0.0.0 without authentication")
    assert err.count("\n") == 1
