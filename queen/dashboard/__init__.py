"""The live dashboard: WebSocket fan-out (hub) and the static web page.

Per-message events (message.pushed, .processing, .completed, .failed) come from every
worker of every host: each worker sends its events in batches through NOTIFY while a
dashboard is open somewhere (queen.dashboard.relay). Depth, queue.created and
system.stats events are read from PostgreSQL and reflect the whole cluster too.
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).with_name("static")
