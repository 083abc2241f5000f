"""The dashboard: its WebSocket (API.md "WebSocket Support") and its page."""

from __future__ import annotations

import falcon

from queen.api import send_json
from queen.dashboard import STATIC_DIR
from queen.dashboard.hub import Hub


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
