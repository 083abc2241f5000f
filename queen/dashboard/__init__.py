"""The live dashboard: WebSocket fan-out (hub) and the static web page.

Per-message events (message.pushed, .processing, .completed, .failed) are the ones
handled by the process the dashboard is connected to; depth, queue.created and
system.stats events are read from PostgreSQL and reflect the whole cluster.
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).with_name("static")
