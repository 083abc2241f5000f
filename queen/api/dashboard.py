"""The dashboard: its WebSocket (API.md "WebSocket Support"), its page and its chart data."""

from __future__ import annotations

import falcon

from queen.api import send_json, validation
from queen.dashboard import STATIC_DIR
from queen.dashboard.hub import Hub
from queen.models import iso
from queen.store import Store

MAX_THROUGHPUT_MINUTES = 24 * 60


class DashboardSocketResource:
    """GET /ws/dashboard: upgraded by the gevent-websocket worker, then served by the hub."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        ws = req.env.get("wsgi.websocket")
        if ws is None:
            send_json(resp, {"error": "this endpoint speaks WebSocket only"}, 426)
            resp.set_header("Upgrade", "websocket")
            return
        self.hub.serve(ws)


class DashboardPageResource:
    """GET / and /dashboard: the single-page dashboard (assets under /dashboard/static/)."""

    def __init__(self) -> None:
        self.page = (STATIC_DIR / "index.html").read_bytes()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_HTML
        resp.cache_control = ["no-cache"]
        resp.data = self.page

    def on_head(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.on_get(req, resp)


class ThroughputResource:
    """GET /api/v1/dashboard/throughput?minutes=60&queue=q: per-minute activity for the chart.

    Counts come from the per-minute rollup, folded by maintenance every few seconds.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        minutes = validation.int_param(req.params, "minutes", 60, 1, MAX_THROUGHPUT_MINUTES)
        queue = validation.name(req.params.get("queue"), "queue", required=False)
        rows = self.store.dashboard.throughput(minutes, queue)
        send_json(
            resp,
            {
                "queue": queue,
                "throughput": [
                    {
                        "timestamp": iso(r.minute),
                        "incoming": r.incoming,
                        "processing": r.popped,
                        "completed": r.completed,
                        "failed": r.failed,
                        "deadLetter": r.dead_letter,
                    }
                    for r in rows
                ],
            },
        )
