"""While PostgreSQL is unreachable every request answers 503 JSON; afterwards the same
server recovers by itself."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
import requests
from psycopg import sql

from tests.conftest import Server
from tests.e2e.test_api import assert_cors

OUTAGE_S = 8.0  # long enough for the pool's reconnect attempts to back off several times
RECOVERY_S = 15.0  # seconds after the database is back within which requests succeed again


def _dbname(dsn: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]  # type: ignore[return-value]


def block(server_dsn: str, dbname: str) -> None:
    """Refuse new connections to dbname and end the existing ones."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(dbname))
        )
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        )


def unblock(server_dsn: str, dbname: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(dbname))
        )


@pytest.fixture
def outage_server(db_dsn: str, server_dsn: str) -> Iterator[Server]:
    srv = Server(db_dsn, DB_TIMEOUT="500").start()
    try:
        yield srv
    finally:
        unblock(server_dsn, _dbname(db_dsn))
        srv.stop()


def _assert_503(r: requests.Response) -> None:
    assert r.status_code == 503, (r.status_code, r.text[:300])
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.json()["error"]
    assert r.headers.get("Retry-After")
    assert_cors(r)


def test_503_while_the_database_is_away_then_recovery(
    outage_server: Server, db_dsn: str, server_dsn: str
) -> None:
    api = f"{outage_server.url}/api/v1"
    assert (
        requests.post(
            f"{api}/push",
            json={"items": [{"queue": "o", "payload": "before", "transactionId": "before"}]},
            timeout=10,
        ).status_code
        == 201
    )

    block(server_dsn, _dbname(db_dsn))
    started = time.monotonic()
    calls = [
        lambda: requests.post(
            f"{api}/push", json={"items": [{"queue": "o", "payload": 1}]}, timeout=15
        ),
        lambda: requests.get(f"{api}/pop/queue/o", timeout=15),
        lambda: requests.get(f"{api}/pop/queue/o/partition/Default", timeout=15),
        lambda: requests.get(f"{api}/pop", params={"namespace": "n"}, timeout=15),
        lambda: requests.post(
            f"{api}/ack", json={"transactionId": "before", "status": "completed"}, timeout=15
        ),
        lambda: requests.post(
            f"{api}/ack/batch",
            json={"acknowledgments": [{"transactionId": "before", "status": "completed"}]},
            timeout=15,
        ),
        lambda: requests.post(f"{api}/configure", json={"queue": "o2"}, timeout=15),
    ]
    for call in calls:
        t0 = time.monotonic()
        _assert_503(call())
        assert time.monotonic() - t0 < 5, "a request waited far longer than DB_TIMEOUT"
    while True:  # keep asking (the pool keeps trying to reconnect) until the outage ends
        health = requests.get(f"{outage_server.url}/health", timeout=15)
        assert health.status_code == 503
        assert health.json()["status"] == "unhealthy"
        assert_cors(health)
        if time.monotonic() - started > OUTAGE_S:
            break
        time.sleep(0.5)
    # Bad input is still answered 400 without the database.
    assert requests.post(
        f"{api}/push", data=b"{", headers={"Content-Type": "application/json"}, timeout=15
    ).status_code == 400

    unblock(server_dsn, _dbname(db_dsn))
    back = time.monotonic()
    while True:
        r = requests.post(
            f"{api}/push",
            json={"items": [{"queue": "o", "payload": "after", "transactionId": "after"}]},
            timeout=15,
        )
        if r.status_code == 201:
            break
        _assert_503(r)
        assert time.monotonic() - back < RECOVERY_S, "did not recover after the outage"
        time.sleep(0.2)
    popped = requests.get(f"{api}/pop/queue/o", params={"batch": 10}, timeout=15)
    assert popped.status_code == 200
    assert [m["transactionId"] for m in popped.json()["messages"]] == ["before", "after"]
    assert requests.get(f"{outage_server.url}/health", timeout=15).status_code == 200


# seconds: an outage answers once the pool's first connection attempt fails, not after
# DB_TIMEOUT (5 s here); the bound only tells the two apart on a loaded machine.
FAST_503_S = 2.5


def test_during_an_outage_requests_answer_503_at_once(db_dsn: str, server_dsn: str) -> None:
    srv = Server(db_dsn, DB_TIMEOUT="5000").start()
    api = f"{srv.url}/api/v1"
    try:
        block(server_dsn, _dbname(db_dsn))
        slowest = 0.0
        for n in range(21):  # the first finds the outage, without waiting DB_TIMEOUT either
            t0 = time.monotonic()
            if n % 2:
                push = {"items": [{"queue": "o", "payload": n}]}
                _assert_503(requests.post(f"{api}/push", json=push, timeout=15))
            elif n % 4:
                health = requests.get(f"{srv.url}/health", timeout=15)
                assert health.status_code == 503
                assert health.json()["status"] == "unhealthy" and health.json()["reason"]
            else:
                _assert_503(requests.get(f"{api}/pop/queue/o", timeout=15))
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.1)
        assert slowest < FAST_503_S, slowest

        unblock(server_dsn, _dbname(db_dsn))
        back = time.monotonic()
        while requests.get(f"{srv.url}/health", timeout=15).status_code != 200:
            assert time.monotonic() - back < RECOVERY_S, "did not recover after the outage"
            time.sleep(0.2)
    finally:
        unblock(server_dsn, _dbname(db_dsn))
        srv.stop()


def test_after_the_pools_backends_are_terminated_the_next_requests_succeed(
    server: Server, db_dsn: str
) -> None:
    api = f"{server.url}/api/v1"
    with requests.Session() as http:
        for n in range(5):
            push = {"items": [{"queue": "t", "payload": n}]}
            assert http.post(f"{api}/push", json=push, timeout=10).status_code == 201
        ours = (
            "FROM pg_stat_activity WHERE application_name = 'queen'"
            " AND datname = current_database()"
        )
        with psycopg.connect(db_dsn, autocommit=True) as admin:
            pids = [pid for (pid,) in admin.execute(f"SELECT pid {ours}").fetchall()]
            assert pids
            admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (pids,))
            # Wait for those backends to be gone (not for none at all: the listener, for
            # one, connects again at once).
            deadline = time.monotonic() + 10
            gone = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY (%s)"
            while admin.execute(gone, (pids,)).fetchone() != (0,):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        for n in range(10):  # PostgreSQL is healthy: no 503
            push = {"items": [{"queue": "t", "payload": n}]}
            r = http.post(f"{api}/push", json=push, timeout=10)
            assert r.status_code == 201, r.text
