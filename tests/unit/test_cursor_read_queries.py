"""The cursor store's read overlay: what Store picks under each QUEEN_STORAGE, and that its
queries stand in for those of queries.sql under the same names."""

from __future__ import annotations

from queen.store import Store
from queen.store.admin import Admin
from queen.store.cursor_admin import CURSOR_READ_QUERIES, OWN_QUERIES, CursorAdmin
from queen.store.db import QUERIES, Database

# The read queries of queries.sql the cursor store answers otherwise (same columns).
REPLACED = {
    "read_partitions", "read_queue_totals", "read_message_span", "read_labels",
    "read_overview", "read_throughput", "read_lag", "read_message", "read_related",
    "dashboard_depths", "dashboard_recent", "dashboard_locate",
}


def test_the_overlay_replaces_the_read_queries_and_keeps_the_rest() -> None:
    assert set(OWN_QUERIES) >= REPLACED and set(QUERIES) >= REPLACED
    for name in REPLACED:
        assert CURSOR_READ_QUERIES[name] == OWN_QUERIES[name] != QUERIES[name]
    assert CURSOR_READ_QUERIES["read_queues"] == QUERIES["read_queues"]
    assert CURSOR_READ_QUERIES["read_session"] == QUERIES["read_session"]
    assert "queen.messages" not in " ".join(OWN_QUERIES.values())


def test_store_picks_the_read_side_of_its_storage() -> None:
    db = Database("host=127.0.0.1 dbname=none")
    rows, cursors = Store(db, storage="rows"), Store(db, storage="cursors")
    assert type(rows.admin) is Admin and rows.reads.queries is QUERIES
    assert isinstance(cursors.admin, CursorAdmin)
    assert cursors.reads.queries is CURSOR_READ_QUERIES
    assert cursors.dashboard.queries is CURSOR_READ_QUERIES
    assert rows.dashboard.queries is QUERIES
