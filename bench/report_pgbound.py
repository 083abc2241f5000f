"""The PostgreSQL-bound phase in a report: rates with the database as the bottleneck, and
what each message cost it.

Its windows (results with phase "pgbound") ran with the bench's cluster under a CPU quota
(bench.pgquota), the server and the load outside it; they are kept out of the other
tables and goals, whose bottleneck is the whole machine.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.tables import fmt, ran, ratio, systems_in

PHASE = "pgbound"
SYSTEMS = ("queen", "minimal", "raw", "pgmq")

# (goal, workload, batch, baseline, op, bound, variant): Queen's figure against the
# baseline's in the same round (docs/PERFORMANCE.md, "Goals").
GOALS = (
    ("PG-bound: e2e batch 100 / raw", "e2e", 100, "raw", ">=", 2.0),
    ("PG-bound: e2e batch 100 / minimal cursor SQL", "e2e", 100, "minimal", ">=", 0.9),
    ("PG-bound: e2e batch 10 / raw", "e2e", 10, "raw", ">=", 2.0),
    ("PG-bound: e2e batch 1 / raw", "e2e", 1, "raw", ">=", 2.0),
    ("PG-bound: push batch 1 / raw", "push", 1, "raw", ">=", 3.0),
    ("PG-bound: push batch 1000 / bare insert (raw)", "push", 1000, "raw", ">=", 0.8),
)
FANOUT_GOAL = ("PG-bound: fan-out 4 groups / copy", ">=", 3.0)
TUPLE_GOALS = ((100, 3.0), (1, 10.0))  # (e2e batch, most tuples fetched a message)


def windows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r.get("phase") == PHASE]


def others(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r.get("phase") != PHASE]


def _window(
    results: list[dict[str, Any]], system: str, workload: str, batch: int, variant: str = ""
) -> dict[str, Any] | None:
    for r in ran(windows(results)):
        if (r["system"], r["workload"], r["batch"]) == (system, workload, batch) and (
            not variant or r.get("variant") == variant
        ):
            return r
    return None


def _pushed_per_acked(r: dict[str, Any] | None) -> float:
    """End to end: messages pushed in the window a message acked (NaN otherwise)."""
    counts = (r or {}).get("counts") or {}
    if (r or {}).get("workload") != "e2e" or not counts.get("acked"):
        return math.nan
    return float(counts.get("pushed", 0)) / float(counts["acked"])


def _value(r: dict[str, Any] | None, key: str = "msgs_per_s") -> float:
    value = r.get(key) if r else None
    return math.nan if value is None else float(value)


def goal_rows(results: list[dict[str, Any]]) -> list[tuple[str, float, str, bool | None]]:
    """(goal, measured, target, met) of one round's PG-bound windows."""
    if not windows(results):
        return []
    rows: list[tuple[str, float, str, bool | None]] = []

    def row(name: str, value: float, op: str, bound: float) -> None:
        met = None if math.isnan(value) else (value >= bound if op == ">=" else value <= bound)
        rows.append((name, value, f"{op} {bound:g}", met))

    for name, workload, batch, base, op, bound in GOALS:
        row(name, ratio(_value(_window(results, "queen", workload, batch)),
                        _value(_window(results, base, workload, batch))), op, bound)
    groups = _window(results, "queen", "fanout", 100, "groups")
    copy = _window(results, "queen", "fanout", 100, "copy")
    row(FANOUT_GOAL[0], ratio(_value(groups), _value(copy)), FANOUT_GOAL[1], FANOUT_GOAL[2])
    for batch, most in TUPLE_GOALS:
        r = _window(results, "queen", "e2e", batch)
        row(f"PG-bound: tuples fetched/msg e2e batch {batch}",
            _value(r, "pg_tuples_fetched_per_msg"), "<=", most)
    for workload, batch in _shapes(results):
        if workload != "e2e":
            continue
        queen = _value(_window(results, "queen", workload, batch), "wal_bytes_per_msg")
        raw = _value(_window(results, "raw", workload, batch), "wal_bytes_per_msg")
        row(f"PG-bound: WAL/msg e2e batch {batch} / raw's", ratio(queen, raw), "<=", 1.0)
    return rows


def _shapes(results: list[dict[str, Any]]) -> list[tuple[str, int]]:
    seen = {(r["workload"], r["batch"]) for r in ran(windows(results))}
    order = {"push": 0, "e2e": 1, "fanout": 2}
    return sorted(seen, key=lambda k: (order.get(k[0], 3), k[1]))


def _clients(r: dict[str, Any]) -> str:
    if r["workload"] == "push":
        return f"{r['producers']}"
    return f"{r['producers']} + {r['consumers']}"


def table(results: list[dict[str, Any]], facts: dict[str, Any]) -> list[str]:
    """Rates and Queen's ratios, then each window's cost a message to PostgreSQL."""
    shown = ran(windows(results))
    if not shown:
        return []
    systems = [s for s in SYSTEMS if s in systems_in(shown, "push") + systems_in(shown, "e2e")
               + systems_in(shown, "fanout")]
    quota = facts.get("pg_quota") or {}
    out = [
        "## PostgreSQL as the bottleneck (messages/s)",
        "",
        f"The bench's cluster ran under a CPU quota of {quota.get('cpus', '?')} core "
        f"(period {quota.get('period_ms', '?')} ms, a cgroup of its processes), the server "
        "and the load outside it. minimal: Queen's model in plain SQL (bench/adapters.py). "
        "Claims and acks of raw and minimal commit without waiting for the disk, as "
        "Queen's do. Fan-out: 4 consumer groups on one queue against Queen's copy into 4 "
        "queues (deliveries acked per second).",
        "",
        "| case | clients | " + " | ".join(systems) + " | queen / raw | queen / minimal |",
        "|---|---|" + "---:|" * (len(systems) + 2),
    ]
    for workload, batch in _shapes(results):
        if workload == "fanout":
            continue
        r = next(x for x in shown if (x["workload"], x["batch"]) == (workload, batch))
        rates = {s: _value(_window(results, s, workload, batch)) for s in systems}
        cells = [fmt(rates[s]) for s in systems]
        vs = [ratio(rates.get("queen", math.nan), rates.get(b, math.nan)) for b in ("raw", "minimal")]
        out.append(f"| {workload} batch {batch} | {_clients(r)} | " + " | ".join(cells)
                   + f" | {fmt(vs[0], 2)} | {fmt(vs[1], 2)} |")
    fan = [r for r in shown if r["workload"] == "fanout"]
    if fan:
        out += ["", "| fan-out | deliveries/s |", "|---|---:|"]
        out += [f"| {r['system']} {r.get('variant')} | {fmt(r['msgs_per_s'])} |" for r in fan]
    out += [
        "",
        "What each message cost PostgreSQL in each window (CPU: the cgroup's; tuples and "
        "commits: pg_stat_database; statements: pg_stat_statements; WAL: the server's). "
        "PG cores: the cluster's CPU over the window, against its quota; throttled: share "
        "of quota periods in which it was held back (near 1: the quota bound the window); "
        "idle: the share of the machine's cores left idle (the load and the server were "
        "not short of CPU while it is well above 0). Pushed/acked: end to end, the "
        "messages pushed in the window a message acked (near 1: the producers waited on "
        "the backlog's cap, and the window's work is whole lifecycles).",
        "",
        "| case | msg/s | pushed/acked | PG µs/msg | tuples fetched/msg | WAL bytes/msg "
        "| commits/msg | statements/msg | PG cores | throttled | idle |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in shown:
        out.append(
            f"| {r['case']} | {fmt(r['msgs_per_s'])} | {fmt(_pushed_per_acked(r), 2)}"
            f" | {fmt(_value(r, 'pg_cpu_us_per_msg'), 1)}"
            f" | {fmt(_value(r, 'pg_tuples_fetched_per_msg'), 1)}"
            f" | {fmt(_value(r, 'wal_bytes_per_msg'))}"
            f" | {fmt(_value(r, 'pg_commits_per_msg'), 2)}"
            f" | {fmt(_value(r, 'pg_statements_per_msg'), 2)}"
            f" | {fmt(_value(r, 'pg_cores'), 2)} | {fmt(_value(r, 'pg_throttled_share'), 2)}"
            f" | {fmt(_value(r.get('cpu'), 'idle'), 2)} |"
        )
    out += _by_role(shown)
    counted = [r for r in shown if r.get("server")]
    if counted:
        out += [
            "",
            "What Queen's workers counted in the same windows (their /metrics): the "
            "statements they sent and the commits they made a message, and the requests "
            "each database call of a kind served (fusion: above 1); the long polls that "
            "parked and the wake-up transactions sent (pushes' and acks'), a message.",
            "",
            "| case | statements/msg | commits/msg | requests a call: push | pop | ack"
            " | polls parked/msg | wake-up calls/msg |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in counted:
            c = r["server"]
            per_call = c.get("requests_per_call", {})
            out.append(
                f"| {r['case']} | {fmt(c['statements_per_msg'], 2)}"
                f" | {fmt(c['commits_per_msg'], 2)}"
                + "".join(f" | {fmt(per_call.get(k, math.nan), 2)}" for k in ("push", "pop", "ack"))
                + f" | {fmt(c.get('parked_per_msg', math.nan), 3)}"
                + f" | {fmt(c.get('wakeup_calls_per_msg', math.nan), 3)} |"
            )
    top = [r for r in shown if r["system"] == "queen" and r.get("pg_top_statements")]
    if top:
        out += [
            "",
            "Queen's statements that took most of PostgreSQL's execution time in each window "
            "(pg_stat_statements, top level: a function's time and blocks include what it "
            "runs; time is wall time in the statement, waits for locks and for the quota "
            "included); then the tuples the whole cluster read a message, by table "
            "(maintenance included; index fetches under a table's name, sequential reads "
            "under its name and \"seq\"):",
            "",
            "| case | statement | calls/msg | rows/call | exec µs/msg | blocks/msg |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for r in top:
            for s in r["pg_top_statements"]:
                text = s["query"].replace("|", "\\|")[:90]
                out.append(f"| {r['case']} | `{text}` | {fmt(s['calls_per_msg'], 2)}"
                           f" | {fmt(s.get('rows_per_call', math.nan), 1)}"
                           f" | {fmt(s['exec_us_per_msg'], 1)}"
                           f" | {fmt(s.get('blocks_per_msg', math.nan), 1)} |")
        out += ["", "| case | tuples read a message, by table |", "|---|---|"]
        for r in top:
            tables = list(r.get("pg_tuples_read_per_msg_by_table", {}).items())[:6]
            listed = ", ".join(f"{name.split(':', 1)[-1]} {fmt(v, 1)}" for name, v in tables)
            out.append(f"| {r['case']} | {listed or '–'} |")
    return out


def _by_role(shown: list[dict[str, Any]]) -> list[str]:
    """PostgreSQL's CPU a message by the role of the process that spent it, for Queen's
    windows (a baseline's load connections close as its clients end, before the window's
    last reading: they would show as exited)."""
    rows = [r for r in shown if r["system"] == "queen" and r.get("pg_cpu_us_per_msg_by_role")]
    if not rows:
        return []
    totals: dict[str, float] = {}
    for r in rows:
        for role, us in r["pg_cpu_us_per_msg_by_role"].items():
            totals[role] = totals.get(role, 0.0) + us
    roles = sorted(totals, key=lambda role: -totals[role])
    out = [
        "",
        "Where Queen's CPU went, µs a message by process (/proc/<pid>/schedstat at the "
        "window's edges): client backends by application name (queen: the server's pool; "
        "bench-meter: these readings), the others by type; exited: what processes that "
        "ended before the window's last reading used (autovacuum workers, mostly).",
        "",
        "| case | " + " | ".join(roles) + " |",
        "|---|" + "---:|" * len(roles),
    ]
    for r in rows:
        spent = r["pg_cpu_us_per_msg_by_role"]
        out.append(f"| {r['case']} | "
                   + " | ".join(fmt(spent.get(role, 0.0), 1) for role in roles) + " |")
    return out


def plot(plt: Any, out_dir: Path, mode: str, results: list[dict[str, Any]]) -> Path | None:
    """Two panels: rates (log) and PostgreSQL CPU µs a message, one bar per system."""
    shapes = [s for s in _shapes(results) if s[0] != "fanout"]
    if not shapes:
        return None
    shown = ran(windows(results))
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in shown)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs = [x + (i - (len(systems) - 1) / 2) * width for x in range(len(shapes))]
        windows_of = [_window(results, system, w, b) for w, b in shapes]
        top.bar(xs, [_value(r) for r in windows_of], width, label=system)
        bottom.bar(xs, [_value(r, "pg_cpu_us_per_msg") for r in windows_of], width, label=system)
    bottom.set_xticks(range(len(shapes)), [f"{w} batch {b}" for w, b in shapes], fontsize=8)
    top.set_yscale("log")
    bottom.set_yscale("log")
    top.set_ylabel("messages / s")
    bottom.set_ylabel("PostgreSQL CPU µs / message")
    top.set_title(f"PostgreSQL as the bottleneck ({mode}: the cluster under a CPU quota)")
    for ax in (top, bottom):
        ax.grid(True, axis="y", which="both", alpha=0.3)
    top.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / f"pgbound-{mode}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
