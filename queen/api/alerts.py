"""Alerts an operator sets on a queue (API.md "Alerts"), evaluated whenever read.

A depth alert fires while the queue's pending messages exceed its threshold, a lag alert
while its oldest pending message is older than threshold seconds, a dead_letters alert
while more than threshold messages were dead-lettered in the last windowMinutes. The
same values reach Prometheus as queen_alert_value and queen_alert_firing.
"""

from __future__ import annotations

import math
from typing import Any

import falcon

from queen.api import auth, read_body, send_json, validation
from queen.errors import InvalidInput, NotFound
from queen.models import iso
from queen.store import Store
from queen.store.dashboard import ALERT_KINDS, Alert

DEFAULT_WINDOW_MINUTES = 5
MAX_WINDOW_MINUTES = 1440


def alert_json(alert: Alert) -> dict[str, Any]:
    return {
        "name": alert.name,
        "queue": alert.queue,
        "kind": alert.kind,
        "threshold": alert.threshold,
        "windowMinutes": alert.window_minutes,
        "createdAt": iso(alert.created_at),
        "value": alert.value,
        "firing": alert.firing,
    }


def _threshold(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput("threshold must be a number")
    if value < 0:
        raise InvalidInput("threshold must be at least 0")
    return float(value)


def _window(value: Any) -> int:
    if value is None:
        return DEFAULT_WINDOW_MINUTES
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput("windowMinutes must be an integer")
    if not 1 <= value <= MAX_WINDOW_MINUTES:
        raise InvalidInput(f"windowMinutes must be between 1 and {MAX_WINDOW_MINUTES}")
    return value


class AlertsResource:
    """GET /alerts: every alert with its queue's value now and whether it fires."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        alerts = self.store.dashboard.alerts()
        send_json(resp, {"alerts": [alert_json(a) for a in alerts]})


class AlertResource:
    """PUT /alerts/{name}: create or replace an alert; DELETE: remove it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_put(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        alert = validation.name(name, "name")
        doc = validation.parse_json_object(read_body(req))
        queue = validation.name(doc.get("queue"), "queue")
        auth.check_queue(req, queue)
        kind = doc.get("kind")
        if kind not in ALERT_KINDS:
            raise InvalidInput(f"kind must be one of {', '.join(ALERT_KINDS)}")
        threshold = _threshold(doc.get("threshold"))
        window = _window(doc.get("windowMinutes"))
        self.store.dashboard.put_alert(alert, queue, kind, threshold, window)
        (found,) = [a for a in self.store.dashboard.alerts() if a.name == alert]
        send_json(resp, alert_json(found))

    def on_delete(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        alert = validation.name(name, "name")
        if not self.store.dashboard.delete_alert(alert):
            raise NotFound(f"alert {alert!r} not found")
        send_json(resp, {"name": alert, "deleted": True})
