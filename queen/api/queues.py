"""Queue configuration (API.md section 4)."""

from __future__ import annotations

import falcon

from queen.api import auth, read_body, send_json, validation
from queen.models import options_from_row
from queen.store import Store


class ConfigureResource:
    def __init__(self, store: Store) -> None:
        self.store = store

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        doc = validation.parse_json_object(read_body(req))
        queue = validation.name(doc.get("queue"), "queue")
        auth.check_queue(req, queue)
        namespace = validation.name(doc.get("namespace"), "namespace", required=False)
        task = validation.name(doc.get("task"), "task", required=False)
        options = validation.queue_options(doc.get("options"))
        row = self.store.queues.configure(queue, namespace, task, options)
        send_json(
            resp,
            {
                "queue": row["name"],
                "namespace": row["namespace"],
                "task": row["task"],
                "configured": True,
                "options": options_from_row(row),
            },
        )
