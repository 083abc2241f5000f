"""Database faults the store survives: backends ended under it, a stalled peer, an outage.

A stalled peer (a frozen proxy) still acknowledges TCP, so no keepalive or
tcp_user_timeout catches it; FrozenProxy plays one.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from queen.errors import Unavailable
from queen.store import Store, bounds, db
from queen.store.bounds import bounded_conninfo
from queen.store.db import Database
from queen.store.maintenance import MaintenanceSession
from tests.integration.helpers import pop, push


class FrozenProxy:
    """A TCP proxy to PostgreSQL that can stop forwarding while keeping every socket open."""

    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        self.target = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=self.listener.getsockname()[1])
        self.frozen = threading.Event()
        self.lose_answer = threading.Event()  # set: drop the next answer, cut that connection
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for a, b, answers in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pipe, args=(a, b, answers), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                while self.frozen.is_set():
                    time.sleep(0.05)
                if answers and self.lose_answer.is_set():
                    self.lose_answer.clear()
                    for sock in (src, dst):
                        sock.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)

    def close(self) -> None:
        self.frozen.clear()
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def proxy(db_dsn: str) -> Iterator[FrozenProxy]:
    p = FrozenProxy(db_dsn)
    yield p
    p.close()


def test_the_bounds_fill_in_what_the_dsn_leaves_out() -> None:
    params = conninfo_to_dict(bounded_conninfo("host=db connect_timeout=30 keepalives_idle=60"))
    assert params["connect_timeout"] == "30" and params["keepalives_idle"] == "60"
    assert params["tcp_user_timeout"] == bounds.CONNECTION_BOUNDS["tcp_user_timeout"]
    assert params["keepalives"] == "1" and params["host"] == "db"


def test_pooled_connections_the_server_ended_are_replaced_before_use(db_dsn: str) -> None:
    database = Database(db_dsn, pool_size=4, timeout_s=5, application_name="queen-ended")
    database.pool.open(wait=True)
    try:
        held = [database.pool.getconn() for _ in range(4)]  # four backends in the pool
        for conn in held:
            database.pool.putconn(conn)
        ours = (
            "FROM pg_stat_activity"
            " WHERE application_name = 'queen-ended' AND datname = current_database()"
        )
        with psycopg.connect(db_dsn, autocommit=True) as admin:
            ended = admin.execute(f"SELECT count(pg_terminate_backend(pid)) {ours}").fetchone()
            assert ended == (4,)
            deadline = time.monotonic() + 10
            while admin.execute(f"SELECT count(*) {ours}").fetchone() != (0,):
                assert time.monotonic() < deadline  # they send their goodbye, then exit
                time.sleep(0.05)
        for _ in range(10):
            assert database.fetch("ping")  # no Unavailable: none of the dead ones is used
    finally:
        database.close()


def test_a_call_to_a_stalled_peer_is_cut_at_its_deadline(proxy: FrozenProxy) -> None:
    database = Database(proxy.dsn, pool_size=2, timeout_s=5, hot_path_timeout_ms=1000)
    database.pool.open(wait=True)
    try:
        assert database.fetch("ping")
        proxy.frozen.set()
        started = time.monotonic()
        with pytest.raises(Unavailable, match="may or may not have been applied"):
            database.fetch("ping")
        elapsed = time.monotonic() - started
        # The deadline is statement_timeout + DEADLINE_MARGIN_S = 3 s (the watchdog looks
        # every 0.5 s); the upper bound only has to tell it from "never".
        assert 2.5 < elapsed < 15, elapsed
    finally:
        database.close()


def test_a_maintenance_session_on_a_stalled_peer_fails_and_lets_go(proxy: FrozenProxy) -> None:
    session = MaintenanceSession(proxy.dsn, statement_timeout_ms=1000)
    session.connect()
    try:
        assert session.try_lead()
        proxy.frozen.set()
        started = time.monotonic()
        with pytest.raises(Unavailable):
            session.expire_leases(10)
        assert time.monotonic() - started < 15
        assert not session.connected  # the leader steps down on this
    finally:
        session.close()


def test_during_an_outage_requests_fail_fast_and_one_probes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refused = "postgresql://postgres@127.0.0.1:1/none"  # nothing listens on port 1
    database = Database(refused, pool_size=2, timeout_s=5)
    database.open()
    try:
        deadline = time.monotonic() + 10
        while database.outage.since is None:  # the pool's first attempt fails
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(5):
            started = time.monotonic()
            with pytest.raises(Unavailable, match="failing fast"):
                database.fetch("ping")
            assert time.monotonic() - started < 1.0
        time.sleep(db.PROBE_EVERY_S)
        started = time.monotonic()
        with pytest.raises(Unavailable):
            database.fetch("ping")  # the probe: waits for the pool, briefly
        assert time.monotonic() - started < db.PROBE_WAIT_S + 1.0
    finally:
        database.close()


def test_the_outage_ends_with_the_first_connection(db_dsn: str) -> None:
    database = Database(db_dsn, pool_size=2, timeout_s=5)
    database.outage.failed()
    database.pool.open(wait=True)  # connects: the outage is over
    try:
        assert database.outage.since is None
        assert database.fetch("ping")
    finally:
        database.close()


@contextlib.contextmanager
def slow_refusal(after_s: float) -> Iterator[str]:
    """Yield a DSN whose server accepts a connection, says nothing for after_s, then hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))

    def refuse() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Timer(after_s, client.close).start()

    threading.Thread(target=refuse, daemon=True).start()
    try:
        yield f"postgresql://postgres@127.0.0.1:{listener.getsockname()[1]}/none"
    finally:
        listener.close()


def test_a_request_already_waiting_when_a_connection_attempt_fails_answers_then() -> None:
    timeout_s = 10.0
    with slow_refusal(after_s=0.5) as dsn:
        database = Database(dsn, pool_size=2, timeout_s=timeout_s)
        database.open()  # the first attempt is under way, not failed yet
        try:
            assert database.outage.since is None
            started = time.monotonic()
            with pytest.raises(Unavailable):
                database.fetch("ping")  # waits: no outage known when it asked
            elapsed = time.monotonic() - started
            assert database.outage.since is not None
            # It ends with the attempt (0.5 s), not with timeout_s.
            assert elapsed < timeout_s / 2, elapsed
        finally:
            database.close()


def test_a_pop_whose_answer_was_lost_with_the_connection_counts_no_retry(
    proxy: FrozenProxy, store: Store
) -> None:
    # retryLimit 0: a claim that counted as an attempt would be dead-lettered undelivered.
    store.queues.configure("lost", None, None, {"lease_time": 1, "retry_limit": 0})
    push(store, [{"queue": "lost", "payload": n, "transactionId": f"lost-{n}"} for n in range(3)])
    proxied = Store(Database(proxy.dsn, pool_size=2, timeout_s=5))
    proxied.db.pool.open(wait=True)
    try:
        proxy.lose_answer.set()  # the claim commits; its answer never arrives
        with pytest.raises(Unavailable):
            pop(proxied, "lost", batch=10)
        deadline = time.monotonic() + 20
        while proxied.messages.give_backs.pending():
            assert time.monotonic() < deadline, "the claim was not given back"
            time.sleep(0.1)
        assert proxied.messages.give_backs.given_back == 3  # it had committed
        time.sleep(1.5)  # past the lease: it would have expired, with a retry, by now
        again = pop(store, "lost", batch=10)
        assert [(m.transaction_id, m.retry_count) for m in again] == [
            (f"lost-{n}", 0) for n in range(3)
        ]
    finally:
        proxied.close()


def test_a_give_back_ends_the_pop_s_backend_only_on_the_server_that_ran_it(db_dsn: str) -> None:
    """After a failover (or a restart) the process id of a lost pop's backend names some
    other session of the new server: that session is left alone."""
    lease = "00000000-0000-0000-0000-000000000001"  # no such lease: nothing to give back
    with psycopg.connect(db_dsn, autocommit=True) as bystander, psycopg.connect(
        db_dsn, autocommit=True
    ) as caller:
        pid = bystander.info.backend_pid
        other_server = "2000-01-01T00:00:00Z"
        (given,) = caller.execute(
            "SELECT queen.give_back_claim(%s, %s, %s)", (lease, pid, other_server)
        ).fetchone()
        assert given == 0
        assert bystander.execute("SELECT 1").fetchone() == (1,)  # still connected
        (given,) = caller.execute(
            "SELECT queen.give_back_claim(%s, %s, pg_postmaster_start_time())", (lease, pid)
        ).fetchone()
        assert given == 0
        with pytest.raises(psycopg.OperationalError):
            bystander.execute("SELECT 1")  # this server's backend of that id was ended
