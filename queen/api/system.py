"""Health (API.md section 7)."""

from __future__ import annotations

from collections.abc import Callable

import falcon

from queen.api import send_json
from queen.errors import Unavailable
from queen.events import Events
from queen.store import Store


class HealthResource:
    def __init__(self, store: Store, events: Events | None, clock: Callable[[], float]) -> None:
        self.store = store
        self.events = events
        self.clock = clock
        self.started = clock()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        uptime = int(self.clock() - self.started)
        pool = self.store.db.stats()
        doc = {
            "uptime": f"{uptime}s",
            "connections": pool["size"],
            "stats": {
                "pool": {"total": pool["size"], "idle": pool["idle"], "waiting": pool["waiting"]}
            },
        }
        try:
            self.store.ping()
        except Unavailable as exc:
            send_json(resp, {"status": "unhealthy", "reason": exc.message, **doc}, 503)
            return
        send_json(resp, {"status": "healthy", **doc})
