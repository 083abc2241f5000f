"""bench.floor serves Queen's three hot routes through a real gunicorn with Queen's
worker class and no queue behind them, and reads what the worker spent on each."""

from __future__ import annotations

import argparse

from bench import floor


def test_the_floor_measures_every_route_at_every_batch_through_a_real_worker(
    server_dsn: str,
) -> None:
    args = argparse.Namespace(
        dsn=server_dsn,
        batches=[1, 100],
        connections=2,
        requests=200,
        rounds=1,
        server="gunicorn",
    )
    costs = floor.measure(args)  # raises when a request is answered other than 200 / 201
    assert set(costs) == {(op, batch) for op in floor.OPERATIONS for batch in (1, 100)}
    assert all(value >= 0 for value in costs.values())
    assert sum(costs.values()) > 0  # the server's CPU was read, not the client's
    report = floor.table(costs, args)
    assert "| 100 |" in report and "one statement a request" in report
