"""Pop by queue: the oldest available partition first (among the first 32 with work from a
random start), whatever was drained before it; every partition reachable."""

from __future__ import annotations

import uuid

import orjson
import psycopg

from queen.models import Popped, PopRoute
from queen.store import Store
from queen.store.messages import message_uuid
from tests import storage
from tests.integration.helpers import (
    ack,
    data,
    expire_leases_now,
    pop,
    push,
    rows,
    scalar,
    with_statements,
)


def _drain(store: Store, queue: str, partitions: list[str]) -> None:
    for p in partitions:
        for m in pop(store, queue, p, batch=10):
            assert ack(store, m.transaction_id).status == "completed"


def test_work_behind_many_drained_partitions_is_found_at_once(store: Store) -> None:
    drained = [f"p{n:02d}" for n in range(40)]
    push(store, [{"queue": "q", "partition": p, "payload": p} for p in drained])
    _drain(store, "q", drained)
    push(store, [{"queue": "q", "partition": "late", "payload": "late"}])
    (m,) = pop(store, "q")
    assert data(m) == "late"


def test_work_behind_drained_partitions_popped_by_queue(store: Store) -> None:
    names = [f"p{n:02d}" for n in range(40)]
    push(store, [{"queue": "q", "partition": p, "payload": p} for p in names])
    for _ in names:
        (m,) = pop(store, "q")
        ack(store, m.transaction_id)
    push(store, [{"queue": "q", "partition": "late", "payload": "late"}])
    (m,) = pop(store, "q")
    assert data(m) == "late"
    assert scalar(store.db.dsn, storage.PARTITIONS_WITH_WORK) == 1  # drained ones left nothing


def test_oldest_partition_first_and_fifo_inside(store: Store) -> None:
    push(store, [{"queue": "q", "partition": "b", "payload": "b1"}])
    push(
        store,
        [
            {"queue": "q", "partition": "a", "payload": "a1"},
            {"queue": "q", "partition": "b", "payload": "b2"},
        ],
    )
    first = pop(store, "q", batch=5)
    assert [data(m) for m in first] == ["b1", "b2"]
    second = pop(store, "q", batch=5)
    assert [data(m) for m in second] == ["a1"]


def test_the_oldest_partition_first_also_before_its_group_has_a_cursor_there(
    store: Store,
) -> None:
    # b gets a cursor (popped by name); a, whose message is older than b's next one,
    # has none yet: a pop by queue still takes a first.
    push(store, [{"queue": "q", "partition": "b", "payload": "b1"}])
    (m,) = pop(store, "q", "b")
    ack(store, m.transaction_id)
    push(store, [{"queue": "q", "partition": "a", "payload": "a1"}])
    push(store, [{"queue": "q", "partition": "b", "payload": "b2"}])
    assert [data(m) for m in pop(store, "q")] == ["a1"]
    assert [data(m) for m in pop(store, "q")] == ["b2"]


def test_a_retried_message_keeps_its_partition_first_in_line(store: Store) -> None:
    push(store, [{"queue": "q", "partition": "old", "payload": "old"}])
    push(store, [{"queue": "q", "partition": "new", "payload": "new"}])
    (m,) = pop(store, "q")
    assert data(m) == "old"
    ack(store, m.transaction_id, "failed")
    (again,) = pop(store, "q")
    assert (data(again), again.retry_count) == ("old", 1)


def test_filtered_pop_serves_the_highest_priority_queue_first(store: Store) -> None:
    store.queues.configure("low", "ns", "job", {"priority": 0})
    store.queues.configure("high", "ns", "job", {"priority": 10})
    store.queues.configure("elsewhere", "other", "job", {"priority": 99})
    push(store, [{"queue": "low", "payload": "low"}])
    push(store, [{"queue": "high", "payload": "high"}])
    push(store, [{"queue": "elsewhere", "payload": "elsewhere"}])
    order = [data(m) for _ in range(3) for m in pop(store, namespace="ns")]
    assert order == ["high", "low"]
    (m,) = pop(store, task="job")
    assert data(m) == "elsewhere"
    assert pop(store, namespace="ns", task="job") == []


def test_a_filtered_pop_tries_only_queues_it_may_find_work_in(store: Store) -> None:
    for name, priority in (("leased", 30), ("drained", 20), ("work", 10), ("none", 40)):
        store.queues.configure(name, "ns", None, {"priority": priority})
    push(store, [{"queue": "leased", "payload": "l1"}, {"queue": "leased", "payload": "l2"}])
    push(store, [{"queue": "drained", "payload": "d"}])
    push(store, [{"queue": "work", "payload": "w"}])
    pop(store, "leased")  # leased, l2 behind the lease
    (d,) = pop(store, "drained")
    ack(store, d.transaction_id)
    route = {"kind": "filter", "namespace": "ns", "group": "__queue__", "batch": 1,
             "worker": "test", "lease": str(uuid.uuid4())}
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        got, calls = with_statements(
            conn, "SELECT payload FROM queen.pop_rows(%s::jsonb)",
            (orjson.dumps([route]).decode(),))
    assert got == [("w",)]
    # (queen.pop once for the filter, once for the one queue with work: no ranking of the
    # others)
    assert calls["pop"] == 2
    assert calls["rankings"] == 1


def _age(store: Store, partition: str, seconds: int) -> None:
    rows(
        store.db.dsn,
        f"UPDATE {storage.MESSAGES} m SET created_at = now() - make_interval(secs => %s)"
        " FROM queen.partitions p WHERE p.id = m.partition_id AND p.name = %s RETURNING 1",
        (seconds, partition),
    )


def test_open_windows_do_not_hide_a_partition_whose_window_closed(store: Store) -> None:
    # windowBuffer 60 s: a partition is served once its newest message is a minute old.
    # More open windows than a pop by queue tries partitions in one call (the cursor
    # store: 32), all with older heads than the ready partition.
    store.queues.configure("w", None, None, {"window_buffer": 60})
    busy = [f"busy{n:02d}" for n in range(40)]
    push(store, [{"queue": "w", "partition": p, "payload": "old"} for p in busy])
    push(store, [{"queue": "w", "partition": "ready", "payload": "ready"}])
    for p in busy:  # old heads, but a new message keeps each window open
        _age(store, p, 120)
    _age(store, "ready", 120)
    push(store, [{"queue": "w", "partition": p, "payload": "new"} for p in busy])
    (m,) = pop(store, "w")
    assert data(m) == "ready"
    assert pop(store, "w") == []


def test_expired_lease_is_taken_over_in_a_windowed_queue(store: Store) -> None:
    store.queues.configure("w", None, None, {"window_buffer": 60, "lease_time": 1})
    push(store, [{"queue": "w", "payload": "x"}])
    _age(store, "Default", 120)
    (m,) = pop(store, "w")
    rows(store.db.dsn, storage.EXPIRE_LEASES + " RETURNING 1")
    (again,) = pop(store, "w")
    assert (again.transaction_id, again.retry_count) == (m.transaction_id, 1)


def _pop_preferring(store: Store, partition: str, batch: int = 1) -> list[tuple[str, object]]:
    """Pop by queue "q" trying partition first; (partition, payload) of what came."""
    popped = store.messages.pop(PopRoute(queue="q"), batch, "test", prefer=partition)
    return [(m.partition, data(m)) for m in popped]


def test_a_preferred_partition_is_popped_first_when_free(store: Store) -> None:
    push(store, [{"queue": "q", "partition": "older", "payload": "o"}])
    push(store, [{"queue": "q", "partition": "newer", "payload": "n1"},
                 {"queue": "q", "partition": "newer", "payload": "n2"}])
    assert _pop_preferring(store, "newer", batch=5) == [("newer", "n1"), ("newer", "n2")]


def test_a_taken_empty_or_unknown_preferred_partition_falls_back_to_the_queue(
    store: Store,
) -> None:
    push(store, [{"queue": "q", "partition": "a", "payload": "a1"},
                 {"queue": "q", "partition": "a", "payload": "a2"}])
    push(store, [{"queue": "q", "partition": "b", "payload": "b1"}])
    push(store, [{"queue": "q", "partition": "c", "payload": "c1"}])
    (first,) = pop(store, "q", "a")  # a is leased now, a2 still pending behind it
    assert _pop_preferring(store, "a") == [("b", "b1")]  # taken: the oldest free one
    assert _pop_preferring(store, "nowhere") == [("c", "c1")]  # unknown
    assert ack(store, first.transaction_id).status == "completed"
    (m,) = pop(store, "q", "a")
    assert ack(store, m.transaction_id).status == "completed"
    assert _pop_preferring(store, "a") == []  # empty, and so is the queue
    # Nothing is left leased by the tries that found nothing.
    assert scalar(store.db.dsn, storage.LEASED_PARTITIONS) == 2


def test_preferring_a_partition_of_another_queue_pops_nothing_from_it(store: Store) -> None:
    push(store, [{"queue": "other", "partition": "p", "payload": "x"}])
    push(store, [{"queue": "q", "partition": "p", "payload": "mine"}])
    assert _pop_preferring(store, "p") == [("p", "mine")]
    assert rows(store.db.dsn, f"SELECT status FROM ({storage.MESSAGE_VIEW}) v WHERE queue = %s",
                ("other",)) == [("pending",)]


def test_pops_a_set_left_after_an_empty_partition_still_walk_the_ranking(
    store: Store,
) -> None:
    # a keeps a1, gone: the set takes a (empty) and b; the pop left walks the ranking,
    # finds a empty again and forgets what it kept.
    dsn = store.db.dsn
    _a_acked_with_a1_kept(store)
    (m,) = pop(store, "q", "b")
    store.polling.unclaim(m.lease_id)  # (b has a cursor row, nothing consumed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE queen.messages DISABLE TRIGGER messages_deleted")
        conn.execute("DELETE FROM queen.messages WHERE payload = '\"a1\"'")
        conn.execute("ALTER TABLE queen.messages ENABLE TRIGGER messages_deleted")
    served, called = _fused_pops(store, 3)
    assert served == {2: ["b1"]}
    assert called["set_claims"] == 1 and called["pop"] == 1
    assert rows(dsn, NEXT, ("a",)) == [(None, None)]


def test_every_partition_of_a_wide_queue_is_reached(store: Store) -> None:
    # More partitions with work than a pop ranks: pops lease them one after the other,
    # from wherever each pop's scan starts, until none is left free.
    names = [f"w{n:03d}" for n in range(300)]  # (wider than a pop ranks whole)
    push(store, [{"queue": "wide", "partition": p, "payload": p} for p in names])
    popped = []
    for _ in names:
        (m,) = pop(store, "wide")
        popped.append(data(m))
    assert sorted(popped) == names
    assert pop(store, "wide") == []  # all leased


def test_pops_of_a_wide_queue_spread_over_its_partitions(store: Store) -> None:
    # Every partition refilled as it is drained: the pops do not keep to a few of them.
    names = [f"s{n:03d}" for n in range(300)]
    push(store, [{"queue": "spread", "partition": p, "payload": p} for p in names])
    served = set()
    for _ in range(60):
        (m,) = pop(store, "spread")
        served.add(data(m))
        ack(store, m.transaction_id)
        push(store, [{"queue": "spread", "partition": data(m), "payload": data(m)}])
    assert len(served) >= 40


def _fused_pops(
    store: Store, pops: int, batch: int = 1, prefer: list[str | None] | None = None
) -> tuple[dict[int, list[str]], dict[str, int]]:
    """pops pops by queue of q in one call (a fused call), each trying its partition of
    prefer first (None: none): each pop's payloads, and how often the call ran each
    function, with the rankings of the queue and the set claims it made ("rankings",
    "set_claims")."""
    one = {"kind": "queue", "queue": "q", "group": "__queue__", "batch": batch, "worker": "test"}
    body = [{**one, "lease": str(uuid.uuid4()), "prefer": (prefer or [None] * pops)[k]}
            for k in range(pops)]
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        got, calls = with_statements(
            conn, "SELECT pop, payload FROM queen.pop_rows(%s::jsonb)",
            (orjson.dumps(body).decode(),))
    served: dict[int, list[str]] = {}
    for pop_no, payload in got:
        served.setdefault(pop_no, []).append(payload)
    return served, calls


def _pop_many_calling(
    store: Store, pops: int, batch: int = 1
) -> tuple[dict[int, list[str]], set[str]]:
    """pops pops by queue of q in one call: each pop's payloads, and the functions the
    call ran."""
    served, calls = _fused_pops(store, pops, batch)
    return served, set(calls)


def _pop_many_preferring(
    store: Store, prefer: list[str | None]
) -> tuple[dict[int, list[str]], dict[str, int]]:
    """One call of pops by queue of q, each trying its partition of prefer first."""
    return _fused_pops(store, len(prefer), prefer=prefer)


def test_fused_woken_pops_take_their_partitions_before_older_ones_in_one_claim(
    store: Store,
) -> None:
    _partitions_with_cursors(store, 2)  # (a's messages are the oldest)
    served, called = _pop_many_preferring(store, ["c", "b"])
    assert served == {1: ["c0"], 2: ["b0"]}
    # One ranking and one claim, whether or not their partitions turn out free: a claim
    # over their partitions alone, then another over the ranking for those it could not
    # serve, cost more under load than the ranking it spared.
    assert called["set_claims"] == 1 and called["rankings"] == 1 and "pop" not in called


def test_a_fused_pop_whose_preferred_partition_is_taken_ranks_once_for_the_call(
    store: Store,
) -> None:
    _partitions_with_cursors(store, 2)
    pop(store, "q", "a")  # a is leased: the pops preferring it take the oldest free ones
    served, called = _pop_many_preferring(store, ["a", "a", None])
    assert served == {1: ["b0"], 2: ["c0"]}
    assert called["rankings"] == 1


def test_woken_pops_of_a_route_are_claimed_as_a_set_over_their_partitions(
    store: Store,
) -> None:
    _partitions_with_cursors(store, 2)
    served, called = _pop_many_preferring(store, ["c", "b"])
    assert served == {1: ["c0"], 2: ["b0"]}
    assert called["set_claims"] == 1 and "pop" not in called  # one claim for both
    # b and c are leased now. Woken pops beside one that was not are one set, over the
    # partitions they were woken for, then the ranking: the first takes a, and nothing
    # is left, nor a lease to take over: no walk follows
    served, called = _pop_many_preferring(store, ["a", "a", "b", None])
    assert served == {1: ["a0"]}
    assert called["set_claims"] == 1 and "pop" not in called


def test_woken_pops_alone_whose_partitions_are_taken_are_a_set_over_the_ranking(
    store: Store,
) -> None:
    _partitions_with_cursors(store, 2)
    for name in ("b", "c"):
        pop(store, "q", name)
    served, called = _pop_many_preferring(store, ["b", "c"])
    assert served == {1: ["a0"]}  # (their partitions first, then the ranking's: one claim)
    assert called["set_claims"] == 1 and called["rankings"] == 1


def _pop_many(store: Store, pops: int, batch: int = 1) -> dict[int, list[str]]:
    """pops pops by queue of q in one call (a fused call): each pop's payloads."""
    return _pop_many_calling(store, pops, batch)[0]


def _partitions_with_cursors(store: Store, messages: int) -> None:
    """Partitions a, b and c of q with messages each, and a cursor in every one, nothing
    consumed (so a set claim takes them)."""
    for name in ("a", "b", "c"):
        push(store, [{"queue": "q", "partition": name, "payload": f"{name}{n}"}
                     for n in range(messages)])
        (m,) = pop(store, "q", name)
        store.polling.unclaim(m.lease_id)


def test_fused_pops_take_the_oldest_free_partitions_one_each(store: Store) -> None:
    _partitions_with_cursors(store, 2)
    assert _pop_many(store, 2, batch=5) == {1: ["a0", "a1"], 2: ["b0", "b1"]}
    assert _pop_many(store, 3, batch=5) == {1: ["c0", "c1"]}  # two left with nothing


def test_pops_a_set_left_with_no_free_partition_get_nothing_at_once(
    store: Store,
) -> None:
    _partitions_with_cursors(store, 2)
    _pop_many(store, 2, batch=5)  # a and b leased
    served, calls = _fused_pops(store, 4, batch=5)
    assert served == {1: ["c0", "c1"]}  # the set takes c, the only free partition
    assert "pop" not in calls  # the others get nothing without a walk of the ranking


def test_pops_of_a_queue_with_every_partition_leased_end_at_the_ranking(
    store: Store,
) -> None:
    _partitions_with_cursors(store, 2)
    for name in ("a", "b", "c"):
        pop(store, "q", name)
    served, calls = _fused_pops(store, 3)
    assert served == {}
    # (The ranking found no partition free: no claim is tried, nor a walk.)
    assert calls["rankings"] == 1 and "set_claims" not in calls and "pop" not in calls


def test_pops_claimed_as_a_set_name_each_message_s_partition(store: Store) -> None:
    _partitions_with_cursors(store, 3)
    one = {"kind": "queue", "queue": "q", "group": "__queue__", "batch": 3, "worker": "test"}
    body = [{**one, "lease": str(uuid.uuid4())} for _ in range(3)]
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        got = conn.execute(
            "SELECT (message).partition, (message).partition_id, (message).payload"
            " FROM queen.pop_many(%s::jsonb)",
            (orjson.dumps(body).decode(),),
        ).fetchall()
        ids = dict(conn.execute("SELECT name, id FROM queen.partitions").fetchall())
    assert sorted(payload for _, _, payload in got) == [f"{p}{n}" for p in "abc" for n in range(3)]
    assert all(payload[0] == partition for partition, _, payload in got)
    assert all(ids[partition] == partition_id for partition, partition_id, _ in got)


def test_fused_pops_take_the_oldest_partition_before_its_cursor_exists(store: Store) -> None:
    push(store, [{"queue": "q", "partition": "b", "payload": "b1"}])
    push(store, [{"queue": "q", "partition": "c", "payload": "c1"}])
    for name in ("b", "c"):
        (m,) = pop(store, "q", name)
        ack(store, m.transaction_id)
    push(store, [{"queue": "q", "partition": "a", "payload": "a1"}])  # no cursor in a
    push(store, [{"queue": "q", "partition": "b", "payload": "b2"}])
    push(store, [{"queue": "q", "partition": "c", "payload": "c2"}])
    assert _pop_many(store, 2) == {1: ["a1"], 2: ["b2"]}


def test_pops_a_set_did_not_serve_still_take_over_an_expired_lease(store: Store) -> None:
    _partitions_with_cursors(store, 2)
    leased = pop(store, "q", "a", batch=5)  # a leased, then its lease runs out
    assert [data(m) for m in leased] == ["a0", "a1"]
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        expire_leases_now(conn)
    served, called = _pop_many_calling(store, 4, batch=5)
    assert sorted(served.values()) == [["a0", "a1"], ["b0", "b1"], ["c0", "c1"]]
    assert {"set_claims", "pop"} <= called  # the set takes b and c; a pop alone, a's lease


NEXT = (
    "SELECT c.next_after = c.cursor_id, c.next_id FROM queen.consumers c"
    " JOIN queen.partitions p ON p.id = c.partition_id WHERE p.name = %s"
)
MESSAGE_ID = "SELECT id FROM queen.messages WHERE payload = to_jsonb(%s::text)"


def _park(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queen.waiting_workers VALUES ('parked', now() + '1 hour')")


def _ack_lease(store: Store, messages: list[Popped]) -> None:
    results = store.messages.ack(
        [{"transactionId": m.transaction_id, "status": "completed", "leaseId": str(m.lease_id)}
         for m in messages]
    )
    assert [r.status for r in results] == ["completed"] * len(messages)


def _a_acked_with_a1_kept(store: Store) -> None:
    """a0 and a1 pushed into a, then b1 into b; a poll parked; a0 popped and its lease
    acked whole: a's cursor row keeps a1."""
    push(store, [{"queue": "q", "partition": "a", "payload": p} for p in ("a0", "a1")])
    push(store, [{"queue": "q", "partition": "b", "payload": "b1"}])
    _park(store.db.dsn)
    (m,) = pop(store, "q", "a")
    _ack_lease(store, [m])


def test_an_ack_keeps_the_next_message_only_while_polls_are_parked(store: Store) -> None:
    # (Without a parked poll no wake-up is sent, and the ranking's probe is left to it.)
    dsn = store.db.dsn
    push(store, [{"queue": "q", "partition": "a", "payload": p} for p in ("a0", "a1", "a2")])
    push(store, [{"queue": "q", "partition": "b", "payload": "b1"}])
    (m,) = pop(store, "q", "a")
    _ack_lease(store, [m])
    assert rows(dsn, NEXT, ("a",)) == [(None, None)]
    _park(dsn)
    (m,) = pop(store, "q", "a")
    _ack_lease(store, [m])
    assert rows(dsn, NEXT, ("a",)) == [(True, scalar(dsn, MESSAGE_ID, ("a2",)))]
    (m,) = pop(store, "q", "b")
    _ack_lease(store, [m])
    assert rows(dsn, NEXT, ("b",)) == [(True, None)]  # (b has nothing more)
    assert [data(m) for m in pop(store, "q", batch=5)] == ["a2"]


def test_the_ranking_passes_over_a_next_message_kept_for_an_earlier_cursor(
    store: Store,
) -> None:
    # Ids a0 < a1 < b1 < a2. The ack of a0's lease keeps a's next message, a1, older than
    # b1: a is ranked first. Once a1 is dead-lettered (a path that keeps nothing), what
    # was kept is for a cursor that moved; a's next is a2, newer than b1: b comes first.
    dsn = store.db.dsn
    store.queues.configure("q", None, None, {"retry_limit": 0})
    push(store, [{"queue": "q", "partition": "a", "payload": p} for p in ("a0", "a1")])
    push(store, [{"queue": "q", "partition": "b", "payload": "b1"}])
    push(store, [{"queue": "q", "partition": "a", "payload": "a2"}])
    _park(dsn)
    (m,) = pop(store, "q", "a")
    _ack_lease(store, [m])
    assert rows(dsn, NEXT, ("a",)) == [(True, scalar(dsn, MESSAGE_ID, ("a1",)))]
    (m,) = pop(store, "q")
    assert data(m) == "a1"
    assert ack(store, m.transaction_id, "failed").status == "dead_letter"
    assert rows(dsn, NEXT, ("a",))[0][0] is False
    assert [data(m) for m in pop(store, "q")] == ["b1"]
    assert [data(m) for m in pop(store, "q")] == ["a2"]


def test_a_deleted_next_message_is_forgotten_by_the_cursor_row(store: Store) -> None:
    dsn = store.db.dsn
    _a_acked_with_a1_kept(store)
    assert rows(dsn, NEXT, ("a",)) == [(True, scalar(dsn, MESSAGE_ID, ("a1",)))]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM queen.messages WHERE payload = '\"a1\"'")
    assert rows(dsn, NEXT, ("a",)) == [(None, None)]
    assert [data(m) for m in pop(store, "q")] == ["b1"]


def test_a_ranking_reads_the_cursor_rows_of_its_own_queue_only(store: Store) -> None:
    # (A join of the partitions with the group's cursor rows may read the group's rows in
    # every queue: here 300 queues, each with a cursor row of queue mode.)
    push(store, [{"queue": f"q{n:03d}", "partition": "p", "payload": n} for n in range(300)]
         + [{"queue": "q000", "partition": f"x{n}", "payload": n} for n in range(3)])
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM generate_series(0, 299) n, queen.pop("
                     "'queue', 'q' || lpad(n::text, 3, '0'), NULL, NULL, NULL, '__queue__', 1,"
                     " 'w', NULL, NULL, gen_random_uuid())")
        conn.execute("ANALYZE queen.consumers")
    with psycopg.connect(store.db.dsn) as conn:  # (no earlier statement's counts pending)
        ranked = conn.execute(
            "SELECT count(*) FROM queen.queues q,"
            " queen.rank_partitions(q, '__queue__', 32) r WHERE q.name = 'q000'"
        ).fetchone()
        read = conn.execute(
            "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
            " WHERE relid = 'queen.consumers'::regclass"
        ).fetchone()
    assert ranked == (3,)  # (p is leased)
    assert read is not None and read[0] <= 4


def test_a_pop_forgets_a_next_message_that_is_not_there(store: Store) -> None:
    # (As where the delete passed over a cursor row another transaction held.)
    dsn = store.db.dsn
    _a_acked_with_a1_kept(store)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE queen.messages DISABLE TRIGGER messages_deleted")
        conn.execute("DELETE FROM queen.messages WHERE payload = '\"a1\"'")
        conn.execute("ALTER TABLE queen.messages ENABLE TRIGGER messages_deleted")
    assert rows(dsn, NEXT, ("a",))[0][0] is True  # kept, though a1 is gone
    assert [data(m) for m in pop(store, "q")] == ["b1"]
    assert rows(dsn, NEXT, ("a",)) == [(None, None)]


def test_pop_many_answers_the_rows_of_pop_rows_as_popped(store: Store) -> None:
    # (What SQL callers and an earlier build's statements read: with the API id, or with
    # p_api_ids false only the bigint id.)
    _partitions_with_cursors(store, 2)
    one = {"kind": "queue", "queue": "q", "group": "__queue__", "batch": 2, "worker": "test"}
    body = orjson.dumps([{**one, "lease": str(uuid.uuid4())} for _ in range(2)]).decode()
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        got = conn.execute(
            "SELECT pop, (message).id, (message).message_id, (message).created_at,"
            " (message).payload, (message).lease_id FROM queen.pop_many(%s::jsonb)",
            (body,)).fetchall()
        conn.execute("UPDATE queen.consumers SET lease_id = NULL")  # (given back)
        bare = conn.execute("SELECT (message).id FROM queen.pop_many(%s::jsonb, false)",
                            (body,)).fetchall()
    assert [(pop, payload) for pop, *_, payload, _ in got] == [
        (1, "a0"), (1, "a1"), (2, "b0"), (2, "b1")]
    assert all(api == message_uuid(bigint, created) for _, api, bigint, created, *_ in got)
    assert len({lease for *_, lease in got}) == 2
    assert bare == [(None,)] * 4


def test_an_earlier_build_s_set_claim_still_serves(store: Store) -> None:
    # (queen.pop_set: what an earlier build's pop_many calls while hosts are replaced.)
    _partitions_with_cursors(store, 2)
    with psycopg.connect(store.db.dsn, autocommit=True) as conn:
        ((pops, payloads),) = conn.execute(
            "SELECT s.pops, ARRAY(SELECT (m).payload #>> '{}' FROM unnest(s.messages) m)"
            " FROM queen.queues q, queen.pop_set(q, '__queue__', 1,"
            " ARRAY(SELECT x FROM queen.candidates(q, '__queue__', 32) x),"
            " '{7,8}', '{w,w}', ARRAY[gen_random_uuid(), gen_random_uuid()], false) s"
            " WHERE q.name = 'q'"
        ).fetchall()
    assert pops == [7, 8] and payloads == ["a0", "b0"]
