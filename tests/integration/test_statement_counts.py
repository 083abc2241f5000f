"""The workers' own count of the statements and commits they send PostgreSQL (the
/metrics figures that show fusion sharing them), on a real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from queen.store import Store
from tests.integration.helpers import push
from tests.integration.test_fusion import fstore, fused, pusher  # noqa: F401 - fixture

Seen = list[tuple[str, bool, bool]]


def counting(store: Store) -> Seen:
    seen: Seen = []
    store.db.observe = lambda query, ran, committed: seen.append((query, ran, committed))
    return seen


def test_a_named_call_is_one_statement_and_its_commit(store: Any) -> None:
    seen = counting(store)
    store.db.fetch("ping")
    assert seen == [("ping", True, True)]


def test_a_transaction_block_commits_once_at_its_end(store: Any) -> None:
    seen = counting(store)
    with store.db.connection() as conn, conn.transaction():
        conn.execute("SELECT 1")
        with conn.transaction():  # a savepoint: no commit of its own
            conn.execute("SELECT 2")
        assert seen == [("other", True, False), ("other", True, False)]
    assert seen[-1] == ("transaction", False, True)


def test_failed_and_rolled_back_work_commits_nothing(store: Any) -> None:
    seen = counting(store)
    with pytest.raises(Exception), store.db.connection() as conn:  # noqa: B017, PT011
        conn.execute("SELECT 1 / 0")
    with pytest.raises(RuntimeError), store.db.connection() as conn, conn.transaction():
        conn.execute("SELECT 1")
        raise RuntimeError("rolled back")
    assert seen == [("other", True, False), ("other", True, False)]


def test_fused_pushes_share_one_statement_and_commit(fstore: Store) -> None:  # noqa: F811
    push(fstore, [{"queue": "s", "payload": "first"}])
    seen = counting(fstore)
    requests = [[{"queue": "s", "payload": n}] for n in range(5)]
    first, *rest = (pusher(fstore, items) for items in requests)
    fused(fstore.messages._push_fusers[None], first, rest)
    pushes = [s for s in seen if s[0] == "push"]
    # the held first request alone, then the four that queued behind it together
    assert pushes == [("push", True, True)] * 2
