"""queen.client.Queen against a real gunicorn: consumers, renewal, producer, failover, retries."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from queen.client import Message, NotFound, Queen, ResponseLost, RetryPolicy
from tests.conftest import ROOT, Server, free_port
from tests.e2e.servers import fresh_server

FAST = RetryPolicy(rounds=3, base_delay=0.05, max_delay=0.2)
__all__ = ["fresh_server"]  # a fixture


class DroppingProxy:
    """A TCP proxy to a server that swallows the answer of its first `drops` connections.

    The request reaches the server (and takes effect); the client sees the connection
    close without an answer, as after a lost response.
    """

    def __init__(self, upstream_port: int, drops: int = 1) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.drops = drops
        self.dropped = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                drop = self.dropped < self.drops
                self.dropped += drop
            threading.Thread(target=self._serve, args=(client, drop), daemon=True).start()

    def _serve(self, client: socket.socket, drop: bool) -> None:
        upstream = socket.create_connection(self.upstream)
        with self._lock:
            self._sockets += [client, upstream]
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if drop:  # the server answered: the request took effect; lose the answer
                    break
                client.sendall(data)
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
            target.shutdown(socket.SHUT_WR)  # the client is gone: so is its connection

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def consume(queen: Queen, queue: str, handler, guard: float = 60.0, **options) -> int:
    """queen.consume(...) without signal handlers, stopped after guard seconds at the latest."""
    consumer = queen.consumer(queue, handler, handle_signals=False, **options)
    timer = threading.Timer(guard, consumer.stop)
    timer.start()
    try:
        return consumer.run()
    finally:
        timer.cancel()


@pytest.fixture
def queen(server):
    with Queen(server.url, retry=FAST) as client:
        yield client


def test_push_pop_ack_round_trip(queen):
    (pushed,) = queen.push("orders", [{"id": 1}], partition="eu")
    assert pushed.status == "queued"
    (message,) = queen.pop("orders", wait=True, timeout=5)
    assert isinstance(message, Message)
    assert (message.transaction_id, message.data, message.partition) == (
        pushed.transaction_id, {"id": 1}, "eu")
    assert message.lease_id and message.retry_count == 0 and message.group is None
    assert queen.ack(message).status == "completed"
    assert queen.pop("orders") == []
    with pytest.raises(NotFound):
        queen.ack("no-such-message")


def requests_served(url: str, method: str, route: str) -> float:
    """The server's count of answered method requests of route (its Prometheus counter)."""
    import requests

    text = requests.get(f"{url}/metrics/prometheus", timeout=10).text
    labels = f'method="{method}",route="{route}"'
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("queen_http_requests_total{") and labels in line
    )


def test_ack_and_pop_acks_then_leases_the_next_messages_in_one_request(queen):
    pushed = queen.push("pairs", [{"n": n} for n in range(5)])
    first = queen.pop("pairs", batch=2)
    results, following = queen.ack_and_pop(first, "pairs", batch=10, wait=True, timeout=5)
    assert [r.status for r in results] == ["completed", "completed"]
    assert [m.transaction_id for m in first + following] == [p.transaction_id for p in pushed]
    results, following = queen.ack_and_pop(following, "pairs", batch=10)
    assert len(results) == 3 and following == []
    queen.push("pairs", [{"n": 5}])
    results, following = queen.ack_and_pop([], "pairs")  # nothing to ack: a pop
    assert results == [] and [m.data for m in following] == [{"n": 5}]
    queen.ack(following[0])
    assert len(queen.messages("pairs", status="completed")) == 6


def test_a_consumer_acks_and_pops_in_one_request_per_batch(queen, server):
    queen.push("paired", [{"i": i} for i in range(30)])
    pops_before = requests_served(server.url, "GET", "/api/v1/pop/queue/{queue}")
    acks_before = requests_served(server.url, "POST", "/api/v1/ack/batch")
    got: list[int] = []
    assert consume(queen, "paired", lambda m: got.append(m.data["i"]), batch=5, limit=30) == 30
    assert sorted(got) == list(range(30))
    # One pop to start; then each batch's ack brings the next (the last one pops nothing).
    assert requests_served(server.url, "GET", "/api/v1/pop/queue/{queue}") - pops_before == 1
    assert requests_served(server.url, "POST", "/api/v1/ack/batch") - acks_before == 6
    assert len(queen.messages("paired", status="completed")) == 30


def test_configure_takes_snake_case_options(queen):
    options = queen.configure("configured", lease_time=42, retry_limit=1, dlq_after_max_retries=True)
    assert options["leaseTime"] == 42 and options["retryLimit"] == 1


def test_consume_acks_completed_and_failed_with_retries_counted(queen):
    queen.configure("jobs", retry_limit=1)
    queen.push("jobs", [{"n": 1}, {"n": "bad"}, {"n": 2}])
    seen: list[object] = []

    def handler(message: Message) -> None:
        seen.append(message.data["n"])
        if message.data["n"] == "bad":
            raise ValueError("cannot handle bad")

    handled = consume(queen, "jobs", handler, limit=4)
    assert handled == 4
    assert Counter(seen) == {1: 1, "bad": 2, 2: 1}  # the bad one: first try and one retry
    (dead,) = queen.dead_letters("jobs")
    assert dead["payload"] == {"n": "bad"} and dead["errorMessage"] == "cannot handle bad"
    assert len(queen.messages("jobs", status="completed")) == 2
    assert queen.retry_dead_letters("jobs") == [dead["transactionId"]]
    assert queen.messages("jobs", status="pending")[0]["transactionId"] == dead["transactionId"]


def test_concurrent_batches_with_a_limit_handle_exactly_the_limit(queen):
    queen.push("many", [{"i": i} for i in range(30)])
    got: list[int] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        with lock:
            got.append(message.data["i"])

    assert consume(queen, "many", handler, batch=4, concurrency=3, limit=25) == 25
    assert len(got) == len(set(got)) == 25
    assert len(queen.messages("many", status="pending")) == 5


def test_a_renewed_lease_outlives_lease_time_without_redelivery(queen, server):
    lease_time = 5  # seconds; the handler takes twice that (renewals may be late under load)
    queen.configure("slow", lease_time=lease_time)
    (pushed,) = queen.push("slow", [{"slow": True}])
    stolen: list[Message] = []
    done = threading.Event()
    handling = threading.Event()

    def probe() -> None:  # another consumer, popping all along once the message is held
        while not handling.wait(0.05) and not done.is_set():  # a pop before could take it
            pass
        with Queen(server.url) as other:
            while not done.is_set():
                stolen.extend(other.pop("slow"))
                time.sleep(0.3)

    def handler(message: Message) -> None:
        handling.set()
        time.sleep(2 * lease_time)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        assert consume(queen, "slow", handler, limit=1) == 1
    finally:
        done.set()
        prober.join()
    assert stolen == []
    stored = queen.message(pushed.transaction_id)
    assert stored["status"] == "completed" and stored["retryCount"] == 0


def test_without_renewal_the_lease_expires_and_the_message_comes_back(queen):
    queen.configure("unrenewed", lease_time=1)
    queen.push("unrenewed", [{"x": 1}])
    deliveries: list[int] = []

    def handler(message: Message) -> None:
        deliveries.append(message.retry_count)
        if len(deliveries) == 1:
            time.sleep(2.5)

    # A second loop pops while the first still handles: the lease expired in between.
    consume(queen, "unrenewed", handler, renew=False, concurrency=2, limit=2)
    assert deliveries == [0, 1]


def test_the_worker_decorator_runs_a_handler(queen):
    queen.push("decorated", [{"v": 1}, {"v": 2}])
    values: list[int] = []

    @queen.worker("decorated", batch=10, handle_signals=False, limit=2)
    def handle(message: Message) -> None:
        values.append(message.data["v"])

    assert handle.run() == 2
    assert sorted(values) == [1, 2]
    handle(Message.from_json({"id": "x", "transactionId": "y", "queue": "q", "partition": "p",
                              "data": {"v": 3}}))
    assert values[-1] == 3


CONSUMER = """
import sys, time
from pathlib import Path
from queen.client import Queen

marks = Path(sys.argv[2])

def handler(message):
    marks.joinpath("started").write_text(message.transaction_id)
    time.sleep(2)
    marks.joinpath("finished").write_text(message.transaction_id)

with Queen(sys.argv[1]) as queen:
    handled = queen.consume("shutdown", handler)
marks.joinpath("handled").write_text(str(handled))
"""


def test_sigterm_mid_handler_finishes_and_acks_the_message_then_exits_0(queen, server, tmp_path):
    (pushed,) = queen.push("shutdown", [{"long": True}])
    queen.push("shutdown", [{"next": True}])
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, server.url, str(tmp_path)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "finished").read_text() == pushed.transaction_id
    assert (tmp_path / "handled").read_text() == "1"
    assert queen.message(pushed.transaction_id)["status"] == "completed"
    assert len(queen.messages("shutdown", status="pending")) == 1  # the next one, untouched


def test_buffered_producer_under_50_threads_stores_every_message_once(queen):
    per_thread = 40
    futures = []
    lock = threading.Lock()
    with queen.producer(linger_ms=5, max_items=500) as producer:

        def send(t: int) -> None:
            mine = [producer.send("produced", {"t": t, "i": i}) for i in range(per_thread)]
            with lock:
                futures.extend(mine)

        threads = [threading.Thread(target=send, args=(t,)) for t in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    results = [f.result(timeout=0) for f in futures]  # all answered by close()
    assert len(results) == 50 * per_thread
    assert {r.status for r in results} == {"queued"}
    assert len({r.transaction_id for r in results}) == len(results)
    (summary,) = [q for q in queen.queues() if q["name"] == "produced"]
    assert summary["messages"]["total"] == 50 * per_thread


def test_failover_to_the_second_server_when_the_first_is_down(db_dsn):
    first, second = Server(db_dsn).start(), Server(db_dsn).start()
    try:
        with Queen([first.url, second.url], retry=FAST) as queen:
            queen.push("failover", [{"n": 1}])
            first.stop()
            queen.push("failover", [{"n": 2}])  # first refuses: the second takes it
            popped = queen.pop("failover", batch=10)
            assert sorted(m.data["n"] for m in popped) == [1, 2]
        dead = f"http://127.0.0.1:{free_port()}"
        with Queen([dead, second.url], retry=FAST) as queen:
            assert queen.pop("failover") == []
    finally:
        first.stop()
        second.stop()


def test_a_push_resent_after_a_dropped_answer_is_stored_once(queen, server):
    proxy = DroppingProxy(server.port, drops=1)
    try:
        with Queen(proxy.url, retry=FAST) as through_proxy:
            (result,) = through_proxy.push("dropped", [{"once": True}])
    finally:
        proxy.close()
    assert proxy.dropped == 1
    assert result.status == "duplicate"  # the resend found the first one stored
    (stored,) = queen.messages("dropped")
    assert stored["transactionId"] == result.transaction_id


def test_a_pop_whose_answer_was_dropped_is_not_resent(queen, server):
    queen.push("lost-pop", [{"n": 1}], partition="a")
    queen.push("lost-pop", [{"n": 2}], partition="b")
    proxy = DroppingProxy(server.port, drops=1)
    try:
        with Queen(proxy.url, retry=FAST) as through_proxy, pytest.raises(ResponseLost):
            through_proxy.pop("lost-pop")
    finally:
        proxy.close()
    # The lost pop leased one partition; a resend would have leased the other one too.
    assert len(queen.messages("lost-pop", status="processing")) == 1
    assert len(queen.messages("lost-pop", status="pending")) == 1


# The tests below: push, pop and ack with consumerGroup, transactions and the
# consumer-group routes.


@pytest.fixture
def fresh_queen(fresh_server):
    with Queen(fresh_server.url, retry=FAST) as client:
        yield client


def test_a_transaction_acks_and_pushes_together(fresh_queen):
    queen = fresh_queen
    queen.push("tx-in", [{"n": 1}])
    (message,) = queen.pop("tx-in")
    results = queen.transaction().ack(message).push("tx-out", [{"n": 2}]).commit()
    assert len(results) == 2
    assert queen.message(message.transaction_id)["status"] == "completed"
    assert [m.data for m in queen.pop("tx-out")] == [{"n": 2}]


def test_consumer_groups_each_see_every_message_and_seek(fresh_queen):
    queen = fresh_queen
    queen.push("fanout", [{"n": 1}, {"n": 2}])
    for group in ("a", "b"):
        popped = queen.pop("fanout", batch=10, group=group, subscription="all")
        assert [m.data["n"] for m in popped] == [1, 2]
        assert {m.group for m in popped} == {group}
        queen.ack_many(popped)
    names = {(g["name"], g["queue"]) for g in queen.consumer_groups()}
    assert {("a", "fanout"), ("b", "fanout")} <= names
    queen.seek("a", "fanout", "beginning")
    assert len(queen.pop("fanout", batch=10, group="a")) == 2
    queen.delete_consumer_group("b", "fanout")
    with pytest.raises(NotFound):
        queen.consumer_group("b")


