"""The bench's queen_sql system (Queen's own statements over psycopg, no HTTP) runs the
lifecycle the server runs: it is how the bench tells the SQL's cost from the request tier's."""

from __future__ import annotations

import pytest

from bench import adapters
from tests.integration.helpers import scalar


def test_queen_sql_pushes_pops_and_acks_until_the_queue_is_empty(db_dsn: str) -> None:
    client = adapters.QueenSqlClient({"dsn": db_dsn}, {"partitions": 1})
    try:
        client.push(3)
        client.push(3)
        first = client.pop(4)
        assert len(first) == 4
        client.ack(first)
        second = client.pop(4)
        assert len(second) == 2
        assert not set(first) & set(second)
        client.ack(second)
        with pytest.raises(adapters.EmptyPop):
            client.pop(4)
    finally:
        client.close()
    assert scalar(db_dsn, "SELECT count(*) FROM queen.messages") == 6
