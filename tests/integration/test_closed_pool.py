"""A request that meets the worker's closed pool (the worker is exiting) is answered 503,
and logged once as a shutdown, not as a database outage."""

from __future__ import annotations

import logging

import pytest
from falcon import testing

from queen.app import SHUTTING_DOWN, create_app
from queen.config import Settings
from queen.store import Store
from queen.store.db import Database


def test_a_request_after_the_pool_closed_says_the_worker_is_shutting_down(
    db_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(Database(db_dsn, pool_size=2, timeout_s=5))
    store.db.pool.open(wait=True)
    settings = Settings.from_env({}, database_url=db_dsn)
    client = testing.TestClient(create_app(settings, store=store))
    store.close()  # what gunicorn's worker_exit does (queen.wsgi.close)
    body = {"items": [{"queue": "closing", "payload": {"n": 1}}]}
    with caplog.at_level(logging.DEBUG):
        answers = [client.simulate_post("/api/v1/push", json=body) for _ in range(3)]
        answers.append(client.simulate_get("/api/v1/pop/queue/closing"))
    for resp in answers:
        assert resp.status_code == 503, resp.text
        assert resp.json == {"error": SHUTTING_DOWN}
        assert resp.headers["retry-after"] == "1"
    told = [r for r in caplog.records if "shutting down" in r.getMessage()]
    assert [r.levelno for r in told] == [logging.INFO] + [logging.DEBUG] * 3
    assert "POST /api/v1/push answered 503: this worker is shutting down" in told[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in caplog.records if r.exc_info]
