"""An ack of whole leases matched by the digest the pop kept (queen.ack_whole_leases),
without reading the messages, and every call it must leave to the item-by-item path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.integration.helpers import with_calls

Conn = psycopg.Connection[Any]
QUEUE = "digests"


@pytest.fixture
def conn(db_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


def push(conn: Conn, partition: str, *txids: str) -> None:
    conn.execute(
        "SELECT count(*) FROM queen.push((SELECT jsonb_agg(jsonb_build_object("
        "'queue', %s::text, 'partition', %s::text, 'payload', t, 'transactionId', t))"
        " FROM unnest(%s::text[]) t), NULL)",
        [QUEUE, partition, list(txids)],
    )


def pop(conn: Conn, partition: str, batch: int, group: str = "__queue__") -> list[str]:
    rows = conn.execute(
        "SELECT (m.message).transaction_id FROM queen.pop_many(jsonb_build_array("
        "jsonb_build_object('kind', 'partition', 'queue', %s::text, 'partition', %s::text,"
        " 'group', %s::text, 'batch', %s::integer, 'worker', 'w', 'lease', gen_random_uuid()))) m",
        [QUEUE, partition, group, batch],
    ).fetchall()
    return [r[0] for r in rows]


def whole(conn: Conn, txids: list[str], sizes: list[int], groups: list[str] | None = None,
          leases: list[str] | None = None) -> bool:
    with conn.transaction():
        (fits,) = conn.execute(
            "SELECT queen.ack_whole_leases(%s::text[], %s::text[], %s::text[], %s::integer[])"
            " IS NOT NULL",
            [txids, groups, leases, sizes],
        ).fetchone() or (None,)
    return bool(fits)


def state(conn: Conn) -> list[tuple[Any, ...]]:
    """Every cursor row and completion of the queue, ids made relative to the queue's first."""
    (base,) = conn.execute("SELECT coalesce(min(id), 0) FROM queen.messages").fetchone() or (0,)
    cursors = conn.execute(
        "SELECT p.name, c.consumer_group, c.cursor_id - %s, c.lease_id IS NULL, c.done_ids,"
        " c.lease_digest IS NULL"
        " FROM queen.consumers c JOIN queen.partitions p ON p.id = c.partition_id ORDER BY 1, 2",
        [base],
    ).fetchall()
    completions = conn.execute(
        "SELECT p.name, k.consumer_group, k.first_id - %s, k.last_id - %s, k.acked"
        " FROM queen.completions k JOIN queen.partitions p ON p.id = k.partition_id"
        " ORDER BY 1, 2, 3",
        [base, base],
    ).fetchall()
    return cursors + completions


def answers(conn: Conn, txids: list[str], sizes: list[int] | None) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT idx, transaction_id, status, retry_count, reason FROM queen.ack_items("
        "%s::text[], NULL, %s::text[], NULL, NULL, %s::integer[])",
        [txids, ["completed"] * len(txids), sizes],
    ).fetchall()


def test_a_whole_lease_acked_as_delivered_completes_without_its_messages(conn: Conn) -> None:
    push(conn, "p", "a", "b", "c", "d")
    leased = pop(conn, "p", 3)
    assert leased == ["a", "b", "c"]
    assert whole(conn, leased, [3])
    assert state(conn) == [
        ("p", "__queue__", 2, True, [], True),  # cursor past c (ids from 0), lease ended
        ("p", "__queue__", 0, 2, 3),  # one completion: a..c
    ]
    assert pop(conn, "p", 3) == ["d"]


def test_leases_of_one_message_each_complete_by_their_digest(conn: Conn) -> None:
    push(conn, "p", "a", "b")
    push(conn, "q", "x")
    leased = pop(conn, "p", 1) + pop(conn, "q", 1)
    assert leased == ["a", "x"]
    assert whole(conn, leased, [1, 1])
    assert state(conn) == [  # (ids from the queue's first: a 0, b 1, x 2)
        ("p", "__queue__", 0, True, [], True), ("q", "__queue__", 2, True, [], True),
        ("p", "__queue__", 0, 0, 1), ("q", "__queue__", 2, 2, 1),
    ]
    assert pop(conn, "p", 1) == ["b"]  # the cursor moved past a only


def test_requests_of_a_fused_call_each_match_their_own_lease(conn: Conn) -> None:
    push(conn, "p", "a1", "a2", "a3")
    push(conn, "q", "b1", "b2")
    first, second = pop(conn, "p", 10), pop(conn, "q", 10)
    fast = answers(conn, first + second, [3, 2])
    assert [(r[1], r[2], r[3], r[4]) for r in fast] == [
        (t, "completed", 0, None) for t in first + second
    ]
    assert [r[0] for r in fast] == [1, 2, 3, 4, 5]
    assert [row[3] for row in state(conn)[:2]] == [True, True]  # both leases ended


def test_a_compact_call_of_whole_leases_answers_one_row_and_others_one_an_item(
    conn: Conn,
) -> None:
    """p_compact (the server's ack): whole leases answer one row of position 0, which
    the server makes each item's from; a call that is not whole leases answers as
    before, one row an item."""
    push(conn, "p", "a1", "a2")
    push(conn, "q", "b1", "b2")

    def compact(txids: list[str], sizes: list[int]) -> list[tuple[Any, ...]]:
        return conn.execute(
            "SELECT idx, transaction_id, status, retry_count, acknowledged_at IS NOT NULL,"
            " reason FROM queen.ack_items(%s::text[], NULL, %s::text[], NULL, NULL,"
            " %s::integer[], true)",
            [txids, ["completed"] * len(txids), sizes],
        ).fetchall()

    first, second = pop(conn, "p", 10), pop(conn, "q", 1)
    assert compact(first, [2]) == [(0, None, "completed", 0, True, None)]
    assert compact(second + ["b9"], [2]) == [  # (not a whole lease: b9 is none of it)
        (1, "b1", "completed", 0, True, None), (2, "b9", "not_found", None, False, "not_found")
    ]


def test_a_lease_that_ended_beside_a_live_one_leaves_the_call_to_the_items_path(
    conn: Conn,
) -> None:
    """A fused call of two requests, one for a lease that is gone (given back, or forgotten
    by a crash that lost its claim's asynchronous commit), so that its row names no lease
    at all: the call is not one of whole leases, and nothing is written for it."""
    push(conn, "p", "a1", "a2")
    push(conn, "q", "b1", "b2")
    first, second = pop(conn, "p", 10), pop(conn, "q", 10)
    conn.execute("SELECT queen.give_back(c.lease_id) FROM queen.consumers c"
                 " JOIN queen.partitions p ON p.id = c.partition_id WHERE p.name = 'q'")
    before = state(conn)
    assert whole(conn, first + second, [2, 2]) is False
    assert state(conn) == before
    fast = answers(conn, first + second, [2, 2])  # decided item by item, without an error
    assert [(r[1], r[2]) for r in fast[:2]] == [(t, "completed") for t in first]
    assert all(r[2] != "completed" for r in fast[2:])


@pytest.mark.parametrize(
    "case",
    ["reordered", "part of the lease", "one request for two leases", "a stranger included",
     "another lease named", "acked in part before", "a message retried",
     "separator in a transactionId", "two requests halving one lease",
     "another message of a lease of one"],
)
def test_anything_but_whole_leases_as_delivered_is_left_to_the_items_path(
    conn: Conn, case: str
) -> None:
    push(conn, "p", "a", "b", "c")
    push(conn, "q", "x", "y")
    if case == "separator in a transactionId":
        push(conn, "r", "s\x1ft", "u")
        leased = pop(conn, "r", 10)
        assert whole(conn, leased, [2]) is False
        return
    if case == "a message retried":
        pop(conn, "p", 1)
        conn.execute(
            "SELECT * FROM queen.ack_items('{a}', NULL, '{failed}', '{boom}', NULL, '{1}')"
        )
    leased = pop(conn, "p", 10 if case != "another message of a lease of one" else 1)
    before = state(conn)
    txids, sizes, leases = leased, [len(leased)], None
    if case == "reordered":
        txids = leased[::-1]
    elif case == "part of the lease":
        txids, sizes = leased[:2], [2]
    elif case == "one request for two leases":
        txids = leased + pop(conn, "q", 10)
        sizes = [len(txids)]
        before = state(conn)
    elif case == "a stranger included":
        txids = leased[:2] + ["x"]
    elif case == "another lease named":
        leases = ["00000000-0000-4000-8000-000000000000"] * len(leased)
    elif case == "acked in part before":
        conn.execute("SELECT * FROM queen.ack_items(%s::text[], NULL, '{completed}', NULL,"
                     " NULL, '{1}')", [leased[:1]])
        txids, sizes = leased[1:], [len(leased) - 1]
        before = state(conn)
    elif case == "two requests halving one lease":
        sizes = [1, len(leased) - 1]
    elif case == "another message of a lease of one":
        txids = ["b"]  # a is leased, alone
    assert whole(conn, txids, sizes, leases=leases) is False
    assert state(conn) == before  # nothing written


def test_the_items_path_answers_what_the_digest_path_answers(db_dsn: str, conn: Conn) -> None:
    """The same pops and acks twice, once with the requests named (the digest path) and
    once without (every item looked up): the same answers and the same rows after."""

    def run(sizes: bool) -> tuple[list[Any], list[Any]]:
        conn.execute("TRUNCATE queen.messages, queen.consumers, queen.completions,"
                     " queen.partitions, queen.queues CASCADE")
        push(conn, "p", "a1", "a2", "a3", "a4", "a5")
        push(conn, "q", "b1", "b2", "b3", "b4")
        got: list[Any] = []
        for batch in (2, 2, 1):  # (a lease of one message has a digest too)
            first, second = pop(conn, "p", batch), pop(conn, "q", batch)
            txids = first + second
            got += answers(conn, txids, [len(first), len(second)] if sizes else None)
        return got, state(conn)

    assert run(sizes=True) == run(sizes=False)


def test_pops_claimed_as_a_set_keep_a_digest_per_lease(conn: Conn) -> None:
    push(conn, "p", "a", "b")
    push(conn, "q", "x", "y")
    rows = conn.execute(
        "SELECT m.pop, (m.message).transaction_id FROM queen.pop_many(jsonb_build_array("
        "jsonb_build_object('kind', 'queue', 'queue', %s::text, 'group', '__queue__',"
        " 'batch', 10, 'worker', 'w', 'lease', gen_random_uuid()),"
        "jsonb_build_object('kind', 'queue', 'queue', %s::text, 'group', '__queue__',"
        " 'batch', 10, 'worker', 'w', 'lease', gen_random_uuid()))) m",
        [QUEUE, QUEUE],
    ).fetchall()
    by_pop: dict[int, list[str]] = {}
    for position, txid in rows:
        by_pop.setdefault(position, []).append(txid)
    assert sorted(map(sorted, by_pop.values())) == [["a", "b"], ["x", "y"]]
    assert whole(conn, by_pop[1] + by_pop[2], [2, 2])
    assert all(row[3] for row in state(conn)[:2])


def test_large_batches_claimed_as_a_set_keep_each_digest_in_id_order(conn: Conn) -> None:
    # Batches of 60 a lease, in more calls of one session than PL/pgSQL makes custom
    # plans for: each lease's digest is of its messages in id order.
    call = (
        "SELECT m.pop, (m.message).transaction_id FROM queen.pop_many((SELECT jsonb_agg("
        "jsonb_build_object('kind', 'queue', 'queue', %s::text, 'group', '__queue__',"
        " 'batch', 100, 'worker', 'w', 'lease', gen_random_uuid()))"
        " FROM generate_series(1, 3))) m"
    )
    for turn in range(7):
        for partition in ("p", "q", "r"):
            push(conn, partition, *(f"{turn}-{partition}-{n:03d}" for n in range(60)))
        by_pop: dict[int, list[str]] = {}
        for position, txid in conn.execute(call, [QUEUE]).fetchall():
            by_pop.setdefault(position, []).append(txid)
        assert sorted(by_pop) == [1, 2, 3]
        assert all(txids == sorted(txids) and len(txids) == 60 for txids in by_pop.values())
        assert whole(conn, by_pop[1] + by_pop[2] + by_pop[3], [60, 60, 60]), turn


def _checked(conn: Conn, acks: list[dict[str, Any]]) -> tuple[list[tuple[Any, ...]], set[str]]:
    """queen.ack_checked (a transaction's acks) of acks: its rows, and the functions it ran."""
    got, calls = with_calls(conn, "SELECT * FROM queen.ack_checked(%s::jsonb)",
                            [psycopg.types.json.Jsonb(acks)])
    return got, set(calls)


def test_a_transaction_s_acks_of_a_whole_lease_are_decided_by_its_digest(conn: Conn) -> None:
    push(conn, "p", "a", "b", "c")
    push(conn, "q", "x", "y")
    pop(conn, "p", 2)
    got, called = _checked(conn, [{"transactionId": t, "status": "completed"} for t in "ab"])
    assert got == [(1, "a", "__queue__", "completed", 0, True),
                   (2, "b", "__queue__", "completed", 0, True)]
    assert "ack_whole_leases" in called and "ack_apply" not in called
    # Part of a lease, or a failure: item by item, as before.
    pop(conn, "q", 2)
    got, called = _checked(conn, [{"transactionId": "x", "status": "completed"}])
    assert got == [(1, "x", "__queue__", "completed", 0, True)] and "ack_apply" in called
    got, called = _checked(conn, [{"transactionId": "y", "status": "failed", "error": "e"}])
    assert [(g[1], g[3], g[5]) for g in got] == [("y", "retry_scheduled", True)]
    assert "ack_whole_leases" not in called
    assert state(conn)[-2:] == [("p", "__queue__", 0, 1, 2), ("q", "__queue__", 3, 3, 1)]
