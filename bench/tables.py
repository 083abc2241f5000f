"""What the report tables share: the results that ran, the systems in order, numbers."""

from __future__ import annotations

import math
from typing import Any


def ran(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results of the cases that did not fail."""
    return [r for r in results if "failed" not in r]


def fmt(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:,.{digits}f}"


def ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def systems_in(results: list[dict[str, Any]], workload: str) -> list[str]:
    """The systems with results for a workload, in the report's order."""
    order = [
        "queen", "queen_sql", "queen3", "minimal", "raw", "pgmq", "pgqueuer", "pgboss", "rabbitmq"
    ]
    present = {r["system"] for r in ran(results) if r["workload"] == workload}
    return [s for s in order if s in present]
