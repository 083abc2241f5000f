"""Clients of each system under test, with one shape: push(n), pop(n) -> handles, ack(handles).

One client instance belongs to one greenlet of a driver process (bench/driver.py) and
holds its own connection. `prepare(system, target)` runs once in the harness process
before a workload and brings the system's storage to an empty, ready state.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import orjson

from bench import http1

PAYLOAD = {"kind": "bench", "body": "x" * 96}  # ~120 bytes of JSON per message
PAYLOAD_JSON = orjson.dumps(PAYLOAD)
QUEUE = "bench"
MAX_PUSH_ITEMS = 1000  # Queen's QUEEN_MAX_BATCH_SIZE default: items per push call


def fanout_queues(groups: int) -> list[str]:
    """The queues of the fan-out copy approach: one per reader, each holding every message."""
    return [f"{QUEUE}_copy{g}" for g in range(groups)]


class EmptyPop(Exception):
    """Nothing to pop right now."""


# --------------------------------------------------------------------------- Queen (HTTP)


def host_url(target: dict[str, Any], spec: dict[str, Any]) -> str:
    """The Queen server a client talks to: of several (--queen-hosts), the one of its index."""
    urls = target.get("urls") or [target["url"]]
    return str(urls[int(spec.get("client_index", 0)) % len(urls)])


class QueenClient:
    """Queen over HTTP/1.1 keep-alive (bench.http1: a client that costs the machine little).

    A consumer acks each batch and pops the next in one request (an ack batch's "next", as
    the SDK's consumers do), naming each message's lease as the SDK does (its handles:
    (transactionId, leaseId)), and pop() hands out what that brought before it asks again;
    system queen3 and the latency probe (which pushes between an ack and the next pop)
    send the pop and the ack each in a request of their own.
    """

    def __init__(self, target: dict[str, Any], spec: dict[str, Any]) -> None:
        url = urlsplit(host_url(target, spec))
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.conn = http1.Connection(self.host, self.port, timeout=60)
        self.partitions = max(1, int(spec.get("partitions", 1)))
        self.wait_ms = int(spec.get("pop_wait_ms", 0))
        self.queue = spec.get("queue", QUEUE)
        self.group = spec.get("consumer_group")
        # The copy approach of the fan-out: every push writes its messages into each queue.
        self.copies = [q.encode() for q in spec.get("copy_queues", [self.queue])]
        self._next_partition = int(spec.get("client_index", 0))
        self.paired = spec.get("system") == "queen" and spec.get("workload") != "latency"
        self._pop_size = 0  # the batch of the last pop: what an ack's next pop asks for
        self._in_hand: list[tuple[str, str | None]] = []  # what the last ack's next pop brought

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        try:
            return self.conn.request(method, path, body)
        except ConnectionError:  # (a keep-alive connection the server closed): once more
            return self.conn.request(method, path, body)

    def push(self, n: int) -> int:
        """Push n messages (into each copy queue: as few calls as the batch limit allows)."""
        partition = f"p{self._next_partition % self.partitions}".encode()
        self._next_partition += 1
        per_call = max(1, MAX_PUSH_ITEMS // n)
        for first in range(0, len(self.copies), per_call):
            items = b",".join(
                b'{"queue":"%s","partition":"%s","payload":%s}' % (queue, partition, PAYLOAD_JSON)
                for queue in self.copies[first : first + per_call]
                for _ in range(n)
            )
            status, body = self._request("POST", "/api/v1/push", b'{"items":[' + items + b"]}")
            if status != 201:
                raise RuntimeError(f"push answered {status}: {body[:200]!r}")
        return n

    def pop(self, n: int) -> list[tuple[str, str | None]]:
        self._pop_size = n
        if self._in_hand:
            handles, self._in_hand = self._in_hand, []
            return handles
        path = f"/api/v1/pop/queue/{self.queue}?batch={n}"
        if self.group:
            path += f"&consumerGroup={self.group}"
        if self.wait_ms:
            path += f"&wait=true&timeout={self.wait_ms}"
        status, body = self._request("GET", path)
        if status == 204:
            raise EmptyPop
        if status != 200:
            raise RuntimeError(f"pop answered {status}: {body[:200]!r}")
        return _handles(body)

    def ack(self, handles: list[tuple[str, str | None]]) -> None:
        group = {"consumerGroup": self.group} if self.group else {}
        if self.paired:
            self._ack_and_pop(handles, group)
            return
        acks = [{"transactionId": txid, "status": "completed", "leaseId": lease, **group}
                for txid, lease in handles]
        if len(acks) == 1:
            doc: dict[str, Any] = acks[0]
            path = "/api/v1/ack"
        else:
            doc = {"acknowledgments": acks}
            path = "/api/v1/ack/batch"
        status, body = self._request("POST", path, orjson.dumps(doc))
        if status != 200:
            raise RuntimeError(f"ack answered {status}: {body[:200]!r}")

    def _ack_and_pop(self, handles: list[tuple[str, str | None]], group: dict[str, str]) -> None:
        then: dict[str, Any] = {"queue": self.queue, "batch": self._pop_size or len(handles)}
        if self.group:
            then["consumerGroup"] = self.group
        if self.wait_ms:
            then.update(wait=True, timeout=self.wait_ms)
        doc = {
            "acknowledgments": [{"transactionId": txid, "status": "completed", "leaseId": lease,
                                 **group} for txid, lease in handles],
            "next": then,
        }
        status, body = self._request("POST", "/api/v1/ack/batch", orjson.dumps(doc))
        if status != 200:
            raise RuntimeError(f"ack answered {status}: {body[:200]!r}")
        self._in_hand = _handles(body)

    def close(self) -> None:
        self.conn.close()


def _handles(body: bytes) -> list[tuple[str, str | None]]:
    """(transactionId, leaseId) of each message a pop answered."""
    return [(m["transactionId"], m.get("leaseId")) for m in orjson.loads(body)["messages"]]


# --------------------------------------------------------------------------- Queen's SQL, no HTTP


class QueenSqlClient:
    """Queen's own named queries (queen/store/queries.sql) straight over psycopg: what the
    SQL costs without HTTP, Falcon and the gunicorn worker (a diagnostic, not a product)."""

    def __init__(self, target: dict[str, Any], spec: dict[str, Any]) -> None:
        import psycopg

        from queen.store.sqlfile import load_queries

        self.queries = load_queries()
        self.conn = psycopg.connect(target["dsn"], autocommit=True)
        # The session as the server's pool sets it up (queen.store.db): timestamps in
        # UTC, and a push's wake-up sent after its commit by notify_sent, not by a
        # NOTIFY inside the push (which queues every pushing commit behind one lock).
        self.conn.execute(
            "SELECT set_config('TimeZone', 'UTC', false),"
            " set_config('queen.push_notify', 'after_commit', false)"
        )
        self.partitions = max(1, int(spec.get("partitions", 1)))
        self.queue = spec.get("queue", QUEUE)
        self.worker = f"bench-{os.getpid()}-{spec.get('client_index', 0)}"
        self._next_partition = int(spec.get("client_index", 0))

    def push(self, n: int) -> int:
        partition = f"p{self._next_partition % self.partitions}"
        self._next_partition += 1
        item = b'{"queue":"%s","partition":"%s","payload":%s}' % (
            self.queue.encode(),
            partition.encode(),
            PAYLOAD_JSON,
        )
        body = b'{"items":[' + b",".join([item] * n) + b"]}"
        self.conn.execute(
            self.queries["push"], {"bodies": f"[{body.decode()}]", "producer": None}
        ).fetchall()
        # What a worker sends once the push committed (queen.store.polling.Wakeups).
        self.conn.execute(
            self.queries["notify_sent"],
            {"queues": [self.queue], "partitions": [partition], "wakes": []},
        )
        return n

    def pop(self, n: int) -> list[str]:
        # One pop as the server's call of one pop carries it (queen.store.messages.pop).
        pop = {
            "kind": "queue", "queue": self.queue, "partition": None, "namespace": None,
            "task": None, "group": "__queue__", "mode": None, "since": None, "batch": n,
            "worker": self.worker, "lease": str(uuid.uuid4()), "prefer": None,
        }
        cur = self.conn.execute(self.queries["pop_one"], pop)
        names = [c.name for c in cur.description or []]
        rows = cur.fetchall()
        if not rows:
            raise EmptyPop
        col = names.index("transaction_id")
        return [r[col] for r in rows]

    def ack(self, handles: list[str]) -> None:
        from queen.store.messages import ack_columns

        acks = [{"transactionId": h, "status": "completed"} for h in handles]
        self.conn.execute(self.queries["ack"], ack_columns(acks)).fetchall()

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------------------- raw SQL ceiling

RAW_DDL = """
DROP SCHEMA IF EXISTS bench_raw CASCADE;
CREATE SCHEMA bench_raw;
CREATE TABLE bench_raw.messages (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition    integer NOT NULL DEFAULT 0,
    payload      jsonb NOT NULL,
    status       text NOT NULL DEFAULT 'pending',
    created_at   timestamptz NOT NULL DEFAULT now(),
    locked_at    timestamptz,
    completed_at timestamptz
) WITH (fillfactor = 80);
CREATE INDEX messages_pending ON bench_raw.messages (id) WHERE status = 'pending';
"""
RAW_PUSH = (
    "INSERT INTO bench_raw.messages (partition, payload)"
    " SELECT %s, value FROM jsonb_array_elements(%s::jsonb)"
)
RAW_POP = (
    "UPDATE bench_raw.messages SET status = 'processing', locked_at = now()"
    " WHERE id = ANY(ARRAY(SELECT id FROM bench_raw.messages WHERE status = 'pending'"
    " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)) RETURNING id, payload"
)
RAW_ACK = (
    "UPDATE bench_raw.messages SET status = 'completed', completed_at = now() WHERE id = ANY(%s)"
)


class RawClient:
    """The same lifecycle straight over psycopg: the ceiling for any SQL-backed queue."""

    def __init__(self, target: dict[str, Any], spec: dict[str, Any]) -> None:
        import psycopg

        self.conn = psycopg.connect(target["dsn"], autocommit=True)
        self.partitions = max(1, int(spec.get("partitions", 1)))
        self._next_partition = int(spec.get("client_index", 0))
        if spec.get("async_acks") and spec.get("role") == "consumer":
            # Claims and acks without waiting for the disk, as Queen commits its own.
            self.conn.execute("SET synchronous_commit = off")

    def push(self, n: int) -> int:
        body = b"[" + b",".join([PAYLOAD_JSON] * n) + b"]"
        self.conn.execute(RAW_PUSH, (self._next_partition % self.partitions, body.decode()))
        self._next_partition += 1
        return n

    def pop(self, n: int) -> list[int]:
        rows = self.conn.execute(RAW_POP, (n,)).fetchall()
        if not rows:
            raise EmptyPop
        return [r[0] for r in rows]

    def ack(self, handles: list[int]) -> None:
        self.conn.execute(RAW_ACK, (handles,))

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------------------- minimal cursors

# Queen's model in plain SQL, and nothing else: the least a cursor lifecycle asks of
# PostgreSQL, as the limit Queen's own SQL is measured against. Immutable messages with a
# system-wide unique transaction id; a push draws ids under its partition's advisory lock
# (so a cursor never passes a message that commits later); a pop leases a free partition
# and reads its next batch in one statement; an ack moves the cursor over the lease.
# No consumer groups, retries, counts or wake-ups.
MINIMAL_DDL = """
DROP SCHEMA IF EXISTS bench_min CASCADE;
CREATE SCHEMA bench_min;
CREATE TABLE bench_min.messages (
    partition      integer NOT NULL,
    id             bigint GENERATED ALWAYS AS IDENTITY,
    transaction_id text NOT NULL DEFAULT gen_random_uuid()::text,
    payload        jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition, id),
    UNIQUE (transaction_id)
);
CREATE TABLE bench_min.cursors (
    partition   integer PRIMARY KEY,
    cursor_id   bigint NOT NULL DEFAULT 0,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    lease_last  bigint
) WITH (fillfactor = 50);
"""
MINIMAL_PUSH = """
WITH locked AS (SELECT pg_advisory_xact_lock(%(partition)s::bigint)),
made AS (INSERT INTO bench_min.cursors (partition) SELECT %(partition)s FROM locked
         ON CONFLICT DO NOTHING)
INSERT INTO bench_min.messages (partition, payload)
SELECT %(partition)s, value FROM locked, jsonb_array_elements(%(items)s::jsonb)
"""
MINIMAL_POP = """
WITH c AS (
    SELECT c.partition, c.cursor_id FROM bench_min.cursors c
    WHERE c.lease_until < now()
      AND EXISTS (SELECT 1 FROM bench_min.messages m
                  WHERE m.partition = c.partition AND m.id > c.cursor_id)
    LIMIT 1 FOR UPDATE SKIP LOCKED
), batch AS MATERIALIZED (
    SELECT m.partition, m.id, m.transaction_id, m.payload
    FROM c CROSS JOIN LATERAL (
        SELECT x.partition, x.id, x.transaction_id, x.payload FROM bench_min.messages x
        WHERE x.partition = c.partition AND x.id > c.cursor_id ORDER BY x.id LIMIT %(batch)s
    ) m
), leased AS (
    UPDATE bench_min.cursors x
    SET lease_until = now() + interval '5 minutes', lease_last = s.last
    FROM (SELECT max(b.id) AS last FROM batch b) s, c
    WHERE x.partition = c.partition AND s.last IS NOT NULL
)
SELECT partition, id, transaction_id, payload FROM batch ORDER BY id
"""
MINIMAL_ACK = """
UPDATE bench_min.cursors SET cursor_id = lease_last, lease_until = '-infinity'
WHERE partition = %(partition)s AND lease_last = %(last)s
"""


class MinimalClient:
    """Queen's model in plain SQL (MINIMAL_DDL): the least work its lifecycle needs."""

    def __init__(self, target: dict[str, Any], spec: dict[str, Any]) -> None:
        import psycopg

        self.conn = psycopg.connect(target["dsn"], autocommit=True)
        self.partitions = max(1, int(spec.get("partitions", 1)))
        self._next_partition = int(spec.get("client_index", 0))
        if spec.get("role") == "consumer" and spec.get("async_acks", True):
            self.conn.execute("SET synchronous_commit = off")

    def push(self, n: int) -> int:
        body = b"[" + b",".join([PAYLOAD_JSON] * n) + b"]"
        partition = self._next_partition % self.partitions
        self._next_partition += 1
        self.conn.execute(MINIMAL_PUSH, {"partition": partition, "items": body.decode()})
        return n

    def pop(self, n: int) -> list[tuple[int, int]]:
        rows = self.conn.execute(MINIMAL_POP, {"batch": n}).fetchall()
        if not rows:
            raise EmptyPop
        return [(r[0], r[1]) for r in rows]

    def ack(self, handles: list[tuple[int, int]]) -> None:
        last = max(h[1] for h in handles)
        self.conn.execute(MINIMAL_ACK, {"partition": handles[0][0], "last": last})

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------------------- pgmq


class PgmqClient:
    """pgmq through its own Python client (sync, psycopg); ack = delete_batch."""

    def __init__(self, target: dict[str, Any], spec: dict[str, Any]) -> None:
        from pgmq import PGMQueue
        from psycopg_pool import ConnectionPool

        self.pool = ConnectionPool(
            target["dsn"], min_size=1, max_size=1, open=True, kwargs={"autocommit": True}
        )
        self.q = PGMQueue(conn_string=target["dsn"], pool=self.pool, init_extension=False)
        self.ack_mode = spec.get("pgmq_ack", "delete")
        self.queue = spec.get("queue", QUEUE)
        # The fan-out's copy approach: a send_batch into each queue (pgmq has no multi-queue send).
        self.copies = spec.get("copy_queues", [self.queue])

    def push(self, n: int) -> int:
        for queue in self.copies:
            self.q.send_batch(queue, [PAYLOAD] * n)
        return n

    def pop(self, n: int) -> list[int]:
        messages = self.q.read(self.queue, vt=300, qty=n)
        if n == 1:
            messages = [messages] if messages else []
        if not messages:
            raise EmptyPop
        return [m.msg_id for m in messages]

    def ack(self, handles: list[int]) -> None:
        if self.ack_mode == "archive":
            self.q.archive_batch(self.queue, handles)
        else:
            self.q.delete_batch(self.queue, handles)

    def close(self) -> None:
        self.pool.close()


# --------------------------------------------------------------------------- RabbitMQ


class RabbitClient:
    """RabbitMQ with pika: durable queue, persistent messages; a push batch is one AMQP
    transaction (tx.commit waits until the broker has the batch), a pop takes up to n
    deliveries of a consumer with prefetch n, an ack batch is one multiple-ack."""

    def __init__(self, target: dict[str, Any], spec: dict[str, Any]) -> None:
        import pika

        self.conn = pika.BlockingConnection(pika.URLParameters(target["amqp"]))
        self.ch = self.conn.channel()
        self.props = pika.BasicProperties(delivery_mode=2, content_type="application/json")
        self._tx = False
        self._deliveries: Any = None
        self.batch = int(spec.get("batch", 1))

    def push(self, n: int) -> int:
        if not self._tx:
            self.ch.tx_select()
            self._tx = True
        for _ in range(n):
            self.ch.basic_publish("", QUEUE, PAYLOAD_JSON, self.props)
        self.ch.tx_commit()
        return n

    def pop(self, n: int) -> list[int]:
        if self._deliveries is None:
            self.ch.basic_qos(prefetch_count=max(n, self.batch))
            self._deliveries = self.ch.consume(QUEUE, inactivity_timeout=0.002)
        tags: list[int] = []
        for method, _props, _body in self._deliveries:
            if method is None:
                break
            tags.append(method.delivery_tag)
            if len(tags) >= n:
                break
        if not tags:
            raise EmptyPop
        return tags

    def ack(self, handles: list[int]) -> None:
        self.ch.basic_ack(max(handles), multiple=True)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection
            self.conn.close()


CLIENTS = {
    "queen": QueenClient,
    "queen3": QueenClient,
    "queen_sql": QueenSqlClient,
    "raw": RawClient,
    "minimal": MinimalClient,
    "pgmq": PgmqClient,
    "rabbitmq": RabbitClient,
}


# --------------------------------------------------------------------------- preparation


def prepare(system: str, target: dict[str, Any], queues: list[str] | None = None) -> None:
    """Empty the system's storage before a workload (harness process, not a driver);
    pgmq gets queues created (default: QUEUE), after every queue of an earlier case is dropped."""
    if system in ("queen", "queen_sql", "queen3"):
        _reset_queen(target["dsn"])
    elif system == "raw":
        _sql(target["dsn"], RAW_DDL)
    elif system == "minimal":
        _sql(target["dsn"], MINIMAL_DDL)
    elif system == "pgmq":
        _sql(target["dsn"], "SELECT pgmq.drop_queue(queue_name) FROM pgmq.meta")
        for queue in queues or [QUEUE]:
            _sql(target["dsn"], f"SELECT pgmq.create('{queue}')")
    elif system == "rabbitmq":
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(target["amqp"]))
        ch = conn.channel()
        ch.queue_delete(QUEUE)
        ch.queue_declare(QUEUE, durable=True)
        conn.close()


# Empty every table of schema queen but the migration history and the running server's
# own state (whatever the schema holds now). queen.waiting_workers lists the workers with
# polls parked: emptied under a running server, pushes and acks find nobody listed and
# send no wake-ups until each worker lists itself again (every 10 s while polls wait), so
# the next case's polls would sleep out their timeouts.
QUEEN_RESET = """
DO $$
DECLARE
    tables text;
BEGIN
    SELECT string_agg(format('%I.%I', schemaname, tablename), ', ') INTO tables
    FROM pg_tables
    WHERE schemaname = 'queen' AND tablename NOT IN ('schema_migrations', 'waiting_workers');
    IF tables IS NOT NULL THEN
        EXECUTE 'TRUNCATE ' || tables || ' CASCADE';
    END IF;
END
$$
"""


def _reset_queen(dsn: str, attempts: int = 5) -> None:
    """Run QUEEN_RESET; the server's maintenance may take its locks in another order
    (a deadlock, which PostgreSQL resolves by failing one side): try again."""
    import psycopg.errors

    for attempt in range(attempts):
        try:
            _sql(dsn, QUEEN_RESET)
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2)


def _sql(dsn: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


def install_pgmq(dsn: str) -> str:
    """Load pgmq's SQL-only install file (shipped in the pgmq wheel); return its version."""
    from importlib.resources import files

    import psycopg

    sql_text = files("pgmq").joinpath("sql", "pgmq.sql").read_text(encoding="utf-8")
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass('pgmq.meta')").fetchone()[0]:  # type: ignore[index]
            with conn.transaction():
                conn.execute(sql_text)  # type: ignore[arg-type]
    try:
        return files("pgmq").joinpath("sql", "VERSION").read_text().strip().splitlines()[-1]
    except OSError:
        return "?"


def rabbit_answers(amqp: str) -> bool:
    try:
        import pika

        pika.BlockingConnection(pika.URLParameters(amqp)).close()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return False


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "no")
