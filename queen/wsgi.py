"""Per-worker process wiring: what gunicorn loads after fork (`queen.wsgi:get_app()`)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from queen import logs
from queen.config import Settings
from queen.server import claims, turns

log = logging.getLogger(__name__)

# This process's store and events registry, for gunicorn's shutdown hooks.
runtime: dict[str, Any] = {}


def assert_cooperative_driver() -> None:
    """Fail fast if psycopg was imported before gevent patched select (it would block the hub)."""
    if "gevent" not in sys.modules:
        return
    from gevent import monkey

    if not monkey.is_module_patched("select"):
        return
    import psycopg.waiting

    if psycopg.waiting.wait is getattr(psycopg.waiting, "wait_c", None):
        raise RuntimeError("psycopg was imported before gevent patched select: it would block")


def get_app() -> Any:
    """Build this worker's app: its own pool and LISTEN connection, created after fork."""
    assert_cooperative_driver()
    from queen.app import create_app
    from queen.dashboard.hub import Hub
    from queen.events import Events
    from queen.store import Store
    from queen.tracing import provider_from_env

    settings = Settings.from_env()
    if not logging.getLogger().handlers:  # served by another server than Queen's gunicorn
        logs.setup("worker", settings.log_level.upper())
    store = Store.from_settings(settings)
    store.messages.claims = claims.for_this_worker()  # for the master, should we die
    hub = Hub.from_settings(settings, store.dashboard)
    # (with the host's other workers; auto: as the node notes show the servers)
    store.take_turns(
        turns.for_this_worker(settings.fusion_turns, settings.db_calls, hub.nodes.servers)
    )
    store.open()
    events = Events(settings.dsn, settings.poll_fallback_s, ready=store.polling.ready_partitions)
    hub.start_relay(store.dashboard.notify)  # batches reach every worker through NOTIFY
    events.on_dashboard = hub.receive
    events.start()
    store.polling.wakeups.start()
    provider = provider_from_env()  # None unless an OTLP endpoint is set
    runtime.update(store=store, events=events, settings=settings, hub=hub, tracing=provider)
    tracer = provider.get_tracer("queen") if provider is not None else None
    return create_app(settings, store=store, events=events, hub=hub, tracer=tracer)


def shutdown() -> None:
    """Release parked polls at once (they answer 204) when the worker is asked to stop."""
    events = runtime.get("events")
    if events is not None:
        events.shutdown()
    hub = runtime.get("hub")
    if hub is not None:
        hub.shutdown()  # dashboard sockets would otherwise hold the worker until graceful_timeout


def close() -> None:
    store = runtime.pop("store", None)
    if store is not None:
        store.close()
    provider = runtime.pop("tracing", None)
    if provider is not None:
        provider.shutdown()  # exports the spans still waiting
