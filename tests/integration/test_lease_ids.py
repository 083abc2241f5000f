"""A lease's id names its partition, so that what finds a lease by its id (extension,
give-back, a scoped token's check) reads one partition's rows, not every consumer row."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import psycopg

from queen.store import Store
from tests.integration.helpers import partition_id, pop, push, scalar

PARTITIONS = 600


def _leased(store: Store) -> None:
    """PARTITIONS partitions of "wide", each leased (by partition)."""
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT count(*) FROM queen.push((SELECT jsonb_agg(jsonb_build_object("
            "'queue', 'wide', 'partition', 'p' || i, 'payload', i))"
            " FROM generate_series(1, %s) i), NULL)", (PARTITIONS,))
        conn.execute(
            "SELECT count(*) FROM generate_series(1, %s) i CROSS JOIN LATERAL"
            " queen.pop('partition', 'wide', 'p' || i, NULL, NULL, '__queue__', 1, 'test',"
            " NULL, NULL, NULL) m", (PARTITIONS,))
        conn.execute("ANALYZE queen.consumers")


READ = ("SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
        " FROM pg_stat_xact_user_tables WHERE relid = 'queen.consumers'::regclass")


def _reads(conn: psycopg.Connection[Any], call: str, params: tuple[Any, ...]) -> tuple[Any, int]:
    """call's answer, and the consumer rows it read (the session's counts not yet
    reported, before and after it)."""
    with conn.transaction():
        (before,) = conn.execute(READ).fetchone() or (0,)
        answer = conn.execute(call, params).fetchone()
        (after,) = conn.execute(READ).fetchone() or (0,)
    return answer, after - before


def test_a_lease_id_begins_with_its_partition_id(store: Store) -> None:
    push(store, [{"queue": "q", "partition": p, "payload": 1} for p in "abc"])
    for name in "bc":  # (cursors there, nothing consumed: pops of one call take them as a set)
        (m,) = pop(store, "q", name)
        store.polling.unclaim(m.lease_id)
    chosen = uuid.uuid4()
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        (lease,) = conn.execute(
            "SELECT lease_id FROM queen.pop('partition', 'q', 'a', NULL, NULL, '__queue__', 1,"
            " 'test', NULL, NULL, %s)", (chosen,)).fetchone() or (None,)
        one = {"kind": "queue", "queue": "q", "group": "__queue__", "batch": 1, "worker": "t"}
        body = [{**one, "lease": str(uuid.uuid4())} for _ in range(2)]
        set_leases = conn.execute(
            "SELECT (message).lease_id, (message).partition_id FROM queen.pop_many(%s::jsonb)",
            (orjson.dumps(body).decode(),)).fetchall()
    a = partition_id(store.db.dsn, "q", "a")
    assert lease.bytes[:6] == a.bytes[:6] and lease.version == 8
    assert lease.bytes[8:] == chosen.bytes[8:]  # (what the caller can give it back by)
    assert len(set_leases) == 2
    assert [(held.bytes[:6], held.version) for held, _ in set_leases] == [
        (p.bytes[:6], 8) for _, p in set_leases]
    assert scalar(store.db.dsn, "SELECT lease_id FROM queen.consumers WHERE partition_id = %s",
                  (a,)) == lease


def test_a_lease_id_is_the_partition_s_first_bytes_version_8_and_the_chosen_rest(
    store: Store,
) -> None:
    pairs = [(uuid.uuid4(), uuid.UUID(bytes=bytes(range(k, k + 16)))) for k in range(100)]
    pairs += [(uuid.uuid4(), uuid.uuid4()) for _ in range(400)]
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        made = conn.execute(
            "SELECT queen.lease_in(p, c) FROM unnest(%s::uuid[], %s::uuid[]) u(p, c)",
            ([p for p, _ in pairs], [c for _, c in pairs])).fetchall()
    expected = [uuid.UUID(bytes=p.bytes[:6] + bytes([0x80 | (c.bytes[6] & 0x0F)]) + c.bytes[7:])
                for p, c in pairs]
    assert [row[0] for row in made] == expected


def test_extension_give_back_and_a_token_s_check_read_one_partition_s_rows(
    store: Store,
) -> None:
    _leased(store)
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        conn.execute("SET track_counts = on")
        (lease,) = conn.execute(
            "SELECT lease_id FROM queen.consumers ORDER BY partition_id OFFSET 300 LIMIT 1"
        ).fetchone() or (None,)
        (expires,), read = _reads(conn, "SELECT queen.extend_lease(%s, NULL)", (lease,))
        assert expires is not None and read <= 3
        (queue,), read = _reads(conn, "SELECT queen.lease_queue(%s)", (lease,))
        assert queue == "wide" and read <= 3
        (given,), read = _reads(conn, "SELECT queen.give_back(%s)", (lease,))
        assert given == 1 and read <= 6
        (again,), _ = _reads(conn, "SELECT queen.extend_lease(%s, 60)", (lease,))
        assert again is None  # given back: the lease has ended


def test_a_lease_is_given_back_by_the_id_its_claim_was_made_under(store: Store) -> None:
    push(store, [{"queue": "q", "partition": "a", "payload": 1}])
    chosen = uuid.uuid4()
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        conn.execute("SELECT * FROM queen.pop('partition', 'q', 'a', NULL, NULL, '__queue__',"
                     " 1, 'test', NULL, NULL, %s)", (chosen,)).fetchall()
        assert conn.execute("SELECT queen.extend_lease(%s, 60)", (chosen,)).fetchone() == (None,)
        assert conn.execute("SELECT queen.give_back(%s)", (chosen,)).fetchone() == (1,)
    (m,) = pop(store, "q")
    assert m.retry_count == 0  # (no attempt counted)


def test_a_lease_made_before_ids_named_partitions_is_still_found(store: Store) -> None:
    push(store, [{"queue": "q", "partition": "a", "payload": 1}])
    (m,) = pop(store, "q")
    old = uuid.UUID(int=m.lease_id.int & ~(0xF << 76) | (0x7 << 76))  # (version 7)
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE queen.consumers SET lease_id = %s WHERE lease_id = %s",
                     (old, m.lease_id))
        assert conn.execute("SELECT queen.extend_lease(%s, 60)", (old,)).fetchone()[0]
        assert conn.execute("SELECT queen.lease_queue(%s)", (old,)).fetchone() == ("q",)
        assert conn.execute("SELECT queen.give_back(%s)", (old,)).fetchone() == (1,)
