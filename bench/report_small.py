"""The small phase in a report: batches of 1 and 10 at high concurrency, side by side.

Its push and end-to-end windows (results with phase "small") are kept out of the other
tables and goals, whose cases have other clients: bench.report takes them apart here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.tables import fmt, ran, ratio, systems_in

PHASE = "small"
# (goal, batch, baseline, factor): Queen's end-to-end rate at least factor x the baseline's.
GOAL = ("small phase: e2e batch 1 / raw ceiling", 1, "raw", 0.5)


def windows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r.get("phase") == PHASE]


def others(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r.get("phase") != PHASE]


def _window(results: list[dict[str, Any]], system: str, workload: str, batch: int) -> Any:
    for r in ran(windows(results)):
        if (r["system"], r["workload"], r["batch"]) == (system, workload, batch):
            return r
    return None


def _rate(results: list[dict[str, Any]], system: str, workload: str, batch: int) -> float:
    r = _window(results, system, workload, batch)
    return float(r["msgs_per_s"]) if r else math.nan


def goal_rows(results: list[dict[str, Any]]) -> list[tuple[str, float, str, bool | None]]:
    """(goal, measured, target, met) of one round's small windows."""
    name, batch, system, factor = GOAL
    v = ratio(_rate(results, "queen", "e2e", batch), _rate(results, system, "e2e", batch))
    return [(name, v, f">= {factor:g}", None if math.isnan(v) else v >= factor)]


def _shapes(results: list[dict[str, Any]]) -> list[tuple[str, int, dict[str, Any]]]:
    """(workload, batch, a window of that shape) in table order: push, then e2e by batch."""
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for r in ran(windows(results)):
        seen.setdefault((r["workload"], r["batch"]), r)
    order = sorted(seen, key=lambda k: (k[0] != "push", k[1]))
    return [(w, b, seen[(w, b)]) for w, b in order]


def _clients(r: dict[str, Any]) -> str:
    if r["workload"] == "push":
        return f"{r['producers']} producers"
    return f"{r['producers']} + {r['consumers']}"


def table(results: list[dict[str, Any]], facts: dict[str, Any]) -> list[str]:
    """The small phase's rates with Queen's ratios to raw and pgmq, then its latencies."""
    small = ran(windows(results))
    if not small:
        return []
    systems = list(dict.fromkeys(systems_in(small, "push") + systems_in(small, "e2e")))
    queen_parts = sorted(
        {r["partitions"] for r in small if r["system"] == "queen" and r["workload"] == "e2e"}
    )
    processes = sorted({r["processes"] for r in small})
    pool = facts.get("queen_pool")
    out = [
        "## Small batches at high concurrency (messages/s)",
        "",
        "push: producers push batch 1; e2e: producers push batch B, consumers pop batch B "
        "and ack it (messages acked per second). Every system has the same clients "
        f"(greenlets, or the async drivers' tasks) over {'/'.join(map(str, processes))} "
        "client processes; each call of a baseline is its own transaction. Queen's "
        f"producers spread over {'/'.join(map(str, queen_parts)) or '–'} partitions; it ran "
        f"{facts.get('queen_workers') or 2} workers with DB_POOL_SIZE {pool or '?'} each.",
        "",
        "| case | clients | " + " | ".join(systems) + " | queen / raw | queen / pgmq |",
        "|---|---|" + "---:|" * (len(systems) + 2),
    ]
    for workload, batch, r in _shapes(results):
        cells = [fmt(_rate(results, s, workload, batch)) for s in systems]
        queen = _rate(results, "queen", workload, batch)
        vs = [ratio(queen, _rate(results, base, workload, batch)) for base in ("raw", "pgmq")]
        out.append(
            f"| {workload} batch {batch} | {_clients(r)} | "
            + " | ".join(cells)
            + f" | {fmt(vs[0], 2)} | {fmt(vs[1], 2)} |"
        )
    out += [
        "",
        "Per-operation latency under that load (ms, p50 / p99); backends = connections to "
        "the system's database as the window opened (Queen: its pools, listeners and "
        "maintenance; the baselines: their clients):",
        "",
        "| case | push | pop | ack | backends | errors |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in small:
        lat = r.get("latency_ms", {})
        cells = [
            f"{fmt(lat[op]['p50'], 1)} / {fmt(lat[op]['p99'], 1)}" if op in lat else "–"
            for op in ("push", "pop", "ack")
        ]
        backends = r.get("backends")
        cells += [
            "–" if backends is None else str(backends),
            str(r.get("counts", {}).get("errors", 0)),
        ]
        out.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    return out


def plot(plt: Any, out_dir: Path, mode: str, results: list[dict[str, Any]]) -> Path | None:
    """Grouped bars: each shape of the small phase, one bar per system (log scale)."""
    shapes = _shapes(results)
    if not shapes:
        return None
    small = ran(windows(results))
    systems = list(dict.fromkeys(systems_in(small, "push") + systems_in(small, "e2e")))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        ax.bar(
            [x + (i - (len(systems) - 1) / 2) * width for x in range(len(shapes))],
            [_rate(results, system, w, b) for w, b, _ in shapes],
            width,
            label=system,
        )
    labels = [f"{w} batch {b}\n{_clients(r)}" for w, b, r in shapes]
    ax.set_xticks(range(len(shapes)), labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("messages / s")
    ax.set_title(f"Small batches at high concurrency ({mode}, 2 cores, one PostgreSQL)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / f"small-{mode}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
