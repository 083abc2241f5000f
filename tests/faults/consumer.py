"""A consumer process of the fault suite: pop, record, ack, record; until SIGTERM.

`python -m tests.faults.consumer URL QUEUE LOG` appends one JSON line per event to LOG,
flushed at once, so a consumer killed with SIGKILL leaves a true record:
{"d": id, "p": partition, "r": retryCount, "t": time, "x": leaseExpiresAt} for a
delivery (a response can arrive after its lease expired, when the message may already
be someone else's),
{"a": id, "t": time} for an ack the server confirmed (status completed), and
{"s": status} for each HTTP answer that was not 2xx (or "conn" for no answer).
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import sys
import time
from typing import IO, Any

import requests

POP_WAIT_MS = 1000
ACK_TRIES_S = 60.0  # seconds an ack is retried: until its outcome is known, past any fault


class Consumer:
    def __init__(self, url: str, queue: str, log: IO[str]) -> None:
        self.api = f"{url}/api/v1"
        self.queue = queue
        self.log = log
        self.http = requests.Session()
        self.running = True

    def record(self, event: dict[str, Any]) -> None:
        self.log.write(json.dumps(event) + "\n")
        self.log.flush()

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response | None:
        try:
            r = self.http.request(method, f"{self.api}{path}", timeout=15, **kwargs)
        except requests.RequestException:
            self.record({"s": "conn", "t": time.time()})
            return None
        if r.status_code >= 300:
            self.record({"s": r.status_code, "t": time.time()})
        return r

    def run(self) -> None:
        while self.running:
            r = self.call(
                "GET", f"/pop/queue/{self.queue}",
                params={"batch": 10, "wait": "true", "timeout": POP_WAIT_MS},
            )
            if r is None or r.status_code != 200:
                if r is None or r.status_code >= 500:
                    time.sleep(0.2)
                continue
            messages = r.json()["messages"]
            now = time.time()
            for m in messages:
                expires = dt.datetime.fromisoformat(m["leaseExpiresAt"]).timestamp()
                self.record({"d": m["transactionId"], "p": m["partition"], "r": m["retryCount"],
                             "t": now, "x": expires})
            self.ack(messages)

    def ack(self, messages: list[dict[str, Any]]) -> None:
        body = {
            "acknowledgments": [
                {"transactionId": m["transactionId"], "status": "completed", "leaseId": m["leaseId"]}
                for m in messages
            ]
        }
        deadline = time.monotonic() + ACK_TRIES_S
        while time.monotonic() < deadline:
            r = self.call("POST", "/ack/batch", json=body)
            if r is not None and r.status_code == 200:
                now = time.time()
                for result in r.json()["results"]:
                    if result["status"] == "completed":
                        self.record({"a": result["transactionId"], "t": now})
                return
            if r is not None and r.status_code < 500:
                return
            time.sleep(0.2)


def main() -> None:
    url, queue, path = sys.argv[1:4]
    with open(path, "a", encoding="utf-8") as log:
        consumer = Consumer(url, queue, log)

        def stop(*_: Any) -> None:
            consumer.running = False

        signal.signal(signal.SIGTERM, stop)
        consumer.run()


if __name__ == "__main__":
    main()
