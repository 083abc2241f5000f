"""Trace context from producer to consumer through a real server, with OpenTelemetry's
SDK and its in-memory exporter in this process."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import requests

from queen.client import AsyncQueen, Queen
from tests.conftest import ROOT
from tests.e2e.servers import module_dsn, module_server, q

__all__ = ["module_dsn", "module_server", "q"]  # fixtures

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
export = pytest.importorskip("opentelemetry.sdk.trace.export")

_exporter = in_memory.InMemorySpanExporter()


@pytest.fixture
def spans():
    """The spans this test ends, from the process's one tracer provider."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk_trace.TracerProvider):
        provider = sdk_trace.TracerProvider()
        provider.add_span_processor(export.SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def by_name(exporter, name: str):
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


def test_a_consumer_continues_the_producers_trace(module_server, q, spans) -> None:
    seen = []
    with Queen(module_server.url) as queen:
        with trace.get_tracer("test").start_as_current_span("checkout") as checkout:
            queen.push(q, [{"order": 1}])
        queen.consume(q, lambda m: seen.append(trace.get_current_span().get_span_context()),
                      limit=1, handle_signals=False)
    producer_trace = checkout.get_span_context().trace_id
    publish, process = by_name(spans, f"{q} publish"), by_name(spans, f"{q} process")
    assert publish.kind is trace.SpanKind.PRODUCER and process.kind is trace.SpanKind.CONSUMER
    assert publish.context.trace_id == process.context.trace_id == producer_trace
    assert process.parent.span_id == publish.context.span_id  # the message's own context
    assert seen[0].trace_id == producer_trace  # the handler runs inside it
    assert process.attributes["messaging.destination.name"] == q


def test_an_async_consumer_continues_the_producers_trace(module_server, q, spans) -> None:
    async def main() -> None:
        async with AsyncQueen(module_server.url) as queen:
            await queen.push(q, [{"order": 2}])
            await queen.consume(q, lambda m: None, limit=1, handle_signals=False)

    asyncio.run(main())
    publish, process = by_name(spans, f"{q} publish"), by_name(spans, f"{q} process")
    assert process.context.trace_id == publish.context.trace_id
    assert process.parent.span_id == publish.context.span_id


def test_the_message_carries_a_w3c_traceparent(module_server, q, spans) -> None:
    with Queen(module_server.url) as queen:
        queen.push(q, [{"order": 3}])
    publish = by_name(spans, f"{q} publish")
    resp = requests.get(f"{module_server.url}/api/v1/pop/queue/{q}", timeout=30)
    (message,) = resp.json()["messages"]
    trace_hex = f"{publish.context.trace_id:032x}"
    span_hex = f"{publish.context.span_id:016x}"
    version, trace_id, parent_id, flags = message["traceId"].split("-")
    assert (version, trace_id, parent_id) == ("00", trace_hex, span_hex)
    assert int(flags, 16) & 1  # sampled


PUSH_ALONE = """
import sys
{block}
from queen.client import Queen
with Queen(sys.argv[1]) as queen:
    queen.push(sys.argv[2], [{{"n": 1}}])
"""
BLOCK_OTEL = """
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError("blocked")
sys.meta_path.insert(0, Refuse())
"""


@pytest.mark.parametrize("block", ["", BLOCK_OTEL], ids=["no-provider", "not-installed"])
def test_without_a_tracer_provider_messages_carry_nothing(module_server, q, block) -> None:
    program = PUSH_ALONE.format(block=block)
    done = subprocess.run([sys.executable, "-c", program, module_server.url, q], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (message,) = requests.get(f"{module_server.url}/api/v1/pop/queue/{q}",
                              timeout=30).json()["messages"]
    assert "traceId" not in message
