"""Turn results into RESULTS-<mode>.md, results-<mode>.json and PNG plots."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from bench import report_pgbound, report_small
from bench.tables import fmt, ran, ratio, systems_in

HEADLINE_PARTITIONS = 16  # Queen's e2e point compared with the baselines
GOALS_DOC = "docs/PERFORMANCE.md"


def find(results: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    for r in ran(results):
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def rate(results: list[dict[str, Any]], **match: Any) -> float:
    r = find(results, **match)
    return float(r["msgs_per_s"]) if r else math.nan


def latency_of(r: dict[str, Any] | None, q: str, op: str = "pop") -> float:
    """Quantile q of op's latency in a latency case (pop, or the probe's push and ack)."""
    if not r:
        return math.nan
    return float(r.get("latency_ms", {}).get(op, {}).get(q, math.nan))


# --------------------------------------------------------------------------- rounds
# With --rounds N every push, e2e and latency case runs N times, all cases of a round
# before the next round, so that each round's systems ran side by side. Results carry
# their round (backlog and memory run once, after the rounds: round 1).


def round_of(r: dict[str, Any]) -> int:
    return int(r.get("round", 1))


def rounds(results: list[dict[str, Any]]) -> list[int]:
    return sorted({round_of(r) for r in results})


def _window_key(r: dict[str, Any]) -> float:
    if r["workload"] == "latency":
        return latency_of(r, "p50")
    return float(r.get("msgs_per_s", math.nan))


def median_windows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per case: of a case run in several rounds, the window with the median
    rate (pop p50 for latency cases; the lower middle of an even count), so that the
    tables show a window that happened, with its own latency and CPU shares."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_case.setdefault(r["case"], []).append(r)
    picked = []
    for runs in by_case.values():
        ok = [r for r in runs if "failed" not in r]
        if len(ok) <= 1:
            picked.append(ok[0] if ok else runs[0])
            continue
        ok.sort(key=_window_key)
        picked.append(ok[(len(ok) - 1) // 2])
    return picked


# --------------------------------------------------------------------------- goals


def goals(
    results: list[dict[str, Any]], wal_baseline: float | None = None
) -> list[tuple[str, float, str, bool | None, list[float]]]:
    """Return (goal, measured, target, met, per round) for each goal of docs/PERFORMANCE.md.

    A goal measured in several rounds is each round's value (its ratios side by side in
    that round) and measured is their median; per round is empty with one round.
    wal_baseline: the earlier row store's WAL bytes per message (else only reported).
    """
    numbers = rounds(results)
    if len(numbers) <= 1:
        return [(*row, []) for row in _goals(results, wal_baseline)]
    values: dict[str, list[float]] = {}
    targets: dict[str, str] = {}
    for n in numbers:
        measured = _goals([r for r in results if round_of(r) == n], wal_baseline)
        for name, value, target, _ in measured:
            if not math.isnan(value):
                values.setdefault(name, []).append(value)
            targets.setdefault(name, target)
    rows: list[tuple[str, float, str, bool | None, list[float]]] = []
    for name, target in targets.items():
        got = values.get(name, [])
        if not got:
            rows.append((name, math.nan, target, None, []))
            continue
        value = statistics.median(got)
        rows.append((name, value, target, _meets(value, target), got if len(got) > 1 else []))
    return rows


def _meets(value: float, target: str) -> bool | None:
    """Whether value meets target ("op bound"); None for a figure only reported."""
    if target == REPORTED:
        return None
    op, bound = target.split()
    limit = float(bound)
    return {">=": value >= limit, "<=": value <= limit, "<": value < limit}[op]


# The throughput goals (docs/PERFORMANCE.md, "Goals"): (goal, workload, batch, baseline
# system, factor), Queen's rate at least factor x the baseline's (end to end at
# HEADLINE_PARTITIONS partitions).
RATE_GOALS = (
    (f"e2e batch 100 (p{HEADLINE_PARTITIONS}) / raw ceiling", "e2e", 100, "raw", 0.8),
    (f"e2e batch 100 (p{HEADLINE_PARTITIONS}) / pgmq", "e2e", 100, "pgmq", 1.5),
    (f"e2e batch 100 (p{HEADLINE_PARTITIONS}) / PgQueuer", "e2e", 100, "pgqueuer", 3.0),
    ("push batch 1000 / raw insert ceiling", "push", 1000, "raw", 0.45),
    ("push batch 1000 / pgmq", "push", 1000, "pgmq", 1.2),
    (f"e2e batch 10 (p{HEADLINE_PARTITIONS}) / raw ceiling", "e2e", 10, "raw", 0.5),
    (f"e2e batch 1 (p{HEADLINE_PARTITIONS}) / raw ceiling", "e2e", 1, "raw", 0.4),
)


FANOUT_GOAL = ("fan-out 4 groups / copy approach", 4, 1.3)  # (goal, groups, factor)
WAL_GOAL = f"WAL bytes/msg e2e batch 100 (p{HEADLINE_PARTITIONS})"
REPORTED = "reported"  # the target of a figure without a bound to meet


def fanout_window(
    results: list[dict[str, Any]], system: str, variant: str, groups: int
) -> dict[str, Any] | None:
    return find(results, system=system, workload="fanout", variant=variant, groups=groups)


def wal_per_message(r: dict[str, Any] | None) -> float:
    value = r.get("wal_bytes_per_msg") if r else None
    return math.nan if value is None else float(value)


def queen_window(results: list[dict[str, Any]], workload: str, batch: int) -> dict[str, Any] | None:
    """Queen's window a throughput goal compares (end to end: the headline partitions)."""
    if workload == "e2e":
        return find(
            results, system="queen", workload=workload, batch=batch, partitions=HEADLINE_PARTITIONS
        )
    return find(results, system="queen", workload=workload, batch=batch)


def _goals(
    results: list[dict[str, Any]], wal_baseline: float | None = None
) -> list[tuple[str, float, str, bool | None]]:
    """(goal, measured, target, met) from one round's results."""

    bound = report_pgbound.goal_rows(results)
    results = report_pgbound.others(results)
    if bound and not ran(results):
        return bound  # a PostgreSQL-bound run: the whole-machine goals do not apply
    crowded = report_small.goal_rows(results)
    results = report_small.others(results)
    lat = find(results, system="queen", workload="latency")
    backlogs = sorted(
        (r for r in ran(results) if r["workload"] == "backlog"), key=lambda r: r["backlog"]
    )
    mem = find(results, workload="memory")
    rows: list[tuple[str, float, str, bool | None]] = []

    def add(name: str, value: float, target: str, met: bool | None) -> None:
        rows.append((name, value, target, None if math.isnan(value) else met))

    for name, workload, batch, system, factor in RATE_GOALS:
        queen = queen_window(results, workload, batch)
        v = ratio(
            float(queen["msgs_per_s"]) if queen else math.nan,
            rate(results, system=system, workload=workload, batch=batch),
        )
        add(name, v, f">= {factor:g}", v >= factor)
    name, groups, factor = FANOUT_GOAL
    together, copied = (
        fanout_window(results, "queen", variant, groups) for variant in ("groups", "copy")
    )
    v = ratio(
        float(together["msgs_per_s"]) if together else math.nan,
        float(copied["msgs_per_s"]) if copied else math.nan,
    )
    add(name, v, f">= {factor:g}", v >= factor)
    v = wal_per_message(queen_window(results, "e2e", 100))
    if wal_baseline:
        add(WAL_GOAL, v, f"<= {wal_baseline / 2:g}", v <= wal_baseline / 2)
    else:
        add(WAL_GOAL, v, REPORTED, None)
    for name, v, target, met in crowded + bound:
        add(name, v, target, met)
    v = latency_of(lat, "p50")
    add("pop p50 at low load (ms)", v, "<= 2", v <= 2)
    v = latency_of(lat, "p99")
    add("pop p99 at low load (ms)", v, "<= 10", v <= 10)
    v = latency_of(lat, "p50", "push")
    add("push p50 at low load, one client (ms)", v, "<= 2", v <= 2)
    if len(backlogs) >= 2:
        small, big = backlogs[0], backlogs[-1]
        v = ratio(latency_of(big, "p50"), latency_of(small, "p50"))
        add(
            f"pop p50 at {big['backlog']:,} / at {small['backlog']:,} pending",
            v,
            "<= 1.2",
            v <= 1.2,
        )
    if mem:
        workers = sum(v for k, v in mem["server_rss"].items() if k.startswith("worker"))
        v = workers / 2**20
        add(f"worker RSS, sum of 2, {mem['backlog']:,} queued (MB)", v, "< 512", v < 512)
    return rows


# --------------------------------------------------------------------------- CPU per message
# Where the two cores of a window went, per message: a rate is what the machine's CPU
# buys, so a goal against a baseline's rate is also a budget of CPU per message.

CPU_PARTS = ("client", "server", "postgres")


def cpu_per_message(r: dict[str, Any]) -> dict[str, float] | None:
    """CPU microseconds per message of a window: client, server, postgres and all three.

    postgres includes its background processes (WAL writer, checkpointer); everything
    else on the machine is left out. None for a window without a rate or a core count.
    """
    cores, per_s = r.get("cores"), float(r.get("msgs_per_s") or 0)
    if not cores or per_s <= 0:
        return None
    cpu = r.get("cpu", {})
    scale = cores * 1e6 / per_s
    parts = {
        "client": cpu.get("client", 0.0) * scale,
        "server": cpu.get("server", 0.0) * scale,
        "postgres": (cpu.get("postgres", 0.0) + cpu.get("pg_background", 0.0)) * scale,
    }
    parts["all"] = sum(parts.values())
    return parts


def budgets(results: list[dict[str, Any]]) -> list[tuple[str, int, str, float, float]]:
    """(workload, batch, goal, CPU per message it allows, Queen's now) per throughput goal.

    The allowance is all of the machine's cores at the rate the goal asks for (the
    baseline's rate times the factor), from the windows given (one round's, or the
    median windows). Goals whose windows are missing are left out.
    """

    results = report_small.others(report_pgbound.others(results))
    rows = []
    for _, workload, batch, system, factor in RATE_GOALS:
        base = find(results, system=system, workload=workload, batch=batch)
        queen = queen_window(results, workload, batch)
        if not base or not queen or not base.get("cores") or base["msgs_per_s"] <= 0:
            continue
        now = cpu_per_message(queen)
        if now is None:
            continue
        allowed = base["cores"] * 1e6 / (factor * base["msgs_per_s"])
        goal = f">= {factor:g}x {system}"
        rows.append((workload, batch, goal, allowed, now["all"]))
    return rows


# --------------------------------------------------------------------------- markdown


def markdown(mode: str, results: list[dict[str, Any]], facts: dict[str, Any]) -> str:
    out = [f"# Queen benchmark ({mode} mode)", ""]
    out += _conditions(facts)
    numbers = rounds(results)
    out += ["", "## Goals", ""]
    if len(numbers) > 1:
        out += [
            f"Push, end-to-end and latency cases ran in {len(numbers)} rounds, every case "
            "of a round before the next round. A goal is the median of its rounds, each "
            "round's ratio taken between windows of that round; the tables below show, "
            "for each case, its window with the median rate (median pop p50 for latency; "
            "of an even count, the lower middle one).",
            "",
            "| goal | measured (median) | rounds | target | met |",
            "|---|---:|---|---|---|",
        ]
    else:
        out += ["| goal | measured | target | met |", "|---|---:|---|---|"]
    baseline = facts.get("wal_baseline")
    for name, value, target, met, per_round in goals(results, baseline):
        mark = "–" if met is None else ("yes" if met else "**no**")
        each = f" {' / '.join(fmt(v, 2) for v in per_round) or '–'} |" if len(numbers) > 1 else ""
        out.append(f"| {name} | {fmt(value, 2)} |{each} {target} | {mark} |")
    out += [
        "",
        "WAL bytes are the whole server's over the window (every database's): exact only on "
        "a server nobody else writes to, as the bench's own (`--cluster`)."
        + (
            f" The WAL goal is half the earlier row store's {fmt(baseline)} bytes per "
            "message (`--wal-baseline`)."
            if baseline
            else ""
        ),
    ]

    shown = median_windows(results)
    bound = report_pgbound.table(shown, facts)
    shown = report_pgbound.others(shown)
    main = report_small.others(shown)
    out += [
        *(["", *bound] if bound else []),
        "",
        *_push_table(main),
        "",
        *_e2e_table(main),
        "",
        *report_small.table(shown, facts),
        "",
        *_fanout_table(shown),
        "",
        *_latency_table(shown),
        "",
        *_backlog_table(shown),
        "",
        *_cpu_table(shown),
        "",
        *_cpu_per_message_table(shown),
    ]
    if len(numbers) > 1:
        out += ["", *_rounds_table(results, numbers)]
    failed = [r for r in results if "failed" in r]
    if failed:
        out += ["", "## Failed cases", ""] + [f"- `{r['case']}`: {r['failed']}" for r in failed]
    # (a table with nothing to show leaves its blank separator: one blank line at most)
    lines = [line for i, line in enumerate(out) if line or (i and out[i - 1])]
    return "\n".join(lines) + "\n"


def _conditions(facts: dict[str, Any]) -> list[str]:
    pg = facts.get("postgres", {})
    versions = ", ".join(f"{k} {v}" for k, v in facts.get("versions", {}).items())
    lines = [
        f"- started {facts.get('started')}, took {facts.get('elapsed_s')} s; commit "
        f"`{facts.get('commit')}` ({facts.get('dirty_files')} tracked files modified)",
        f"- machine: {facts.get('cpu')}; load average at the end {facts.get('load_avg_at_end')}",
        f"- PostgreSQL {pg.get('server_version')} ({facts.get('postgres_server', '?')}): "
        f"autovacuum {pg.get('autovacuum', '?')}, shared_buffers {pg.get('shared_buffers')}, "
        f"synchronous_commit {pg.get('synchronous_commit')}, fsync {pg.get('fsync')}",
        f"- Queen: {hosts(facts)}gunicorn, {facts.get('queen_workers') or 2} gevent workers, "
        f"DB_POOL_SIZE {facts.get('queen_pool') or 10} per worker, maintenance process "
        f"{'on' if facts.get('queen_maintenance') else 'absent'}; Python {facts.get('python')}",
        f"- versions: {versions}",
    ]
    for system, why in facts.get("skipped", {}).items():
        lines.append(f"- skipped {system}: {why}")
    return lines


def _push_table(results: list[dict[str, Any]]) -> list[str]:
    systems = systems_in(results, "push")
    batches = sorted({r["batch"] for r in ran(results) if r["workload"] == "push"})
    if not batches:
        return []
    out = [
        "## Push only (messages/s)",
        "",
        "| batch | " + " | ".join(systems) + " | queen / raw |",
        "|---:|" + "---:|" * (len(systems) + 1),
    ]
    for b in batches:
        cells = [fmt(rate(results, system=s, workload="push", batch=b)) for s in systems]
        r = ratio(
            rate(results, system="queen", workload="push", batch=b),
            rate(results, system="raw", workload="push", batch=b),
        )
        out.append(f"| {b} | " + " | ".join(cells) + f" | {fmt(r, 2)} |")
    return out


def _e2e_table(results: list[dict[str, Any]]) -> list[str]:
    e2e = [r for r in ran(results) if r["workload"] == "e2e"]
    if not e2e:
        return []
    queens = [
        (s, n)
        for s in ("queen", "queen_sql", "queen3")
        for n in sorted({r["partitions"] for r in e2e if r["system"] == s})
    ]
    peers = [s for s in systems_in(results, "e2e") if s not in ("queen", "queen_sql", "queen3")]
    cols = [f"{s} p{n}" for s, n in queens] + peers
    out = [
        "## End to end: push batch B, pop batch B, ack batch (messages/s acknowledged)",
        "",
        "Queen pops by queue (any free partition, long poll 1 s); pN = partitions the "
        "producers spread over. Baselines have no partitions.",
        "",
        "| batch | " + " | ".join(cols) + f" | queen p{HEADLINE_PARTITIONS} / raw |",
        "|---:|" + "---:|" * (len(cols) + 1),
    ]
    for b in sorted({r["batch"] for r in e2e}):
        cells = [
            fmt(rate(results, system=s, workload="e2e", batch=b, partitions=n)) for s, n in queens
        ]
        cells += [fmt(rate(results, system=s, workload="e2e", batch=b)) for s in peers]
        vs_raw = ratio(
            rate(results, system="queen", workload="e2e", batch=b, partitions=HEADLINE_PARTITIONS),
            rate(results, system="raw", workload="e2e", batch=b),
        )
        out.append(f"| {b} | " + " | ".join(cells) + f" | {fmt(vs_raw, 2)} |")
    out += [
        "",
        "Per-operation latency under that load (ms, p50 / p99):",
        "",
        "| case | push | pop | ack | messages per pop | empty pops |",
        "|---|---|---|---|---:|---:|",
    ]
    for r in e2e:
        lat = r.get("latency_ms", {})
        cells = [
            f"{fmt(lat[op]['p50'], 1)} / {fmt(lat[op]['p99'], 1)}" if op in lat else "–"
            for op in ("push", "pop", "ack")
        ]
        counts = r.get("counts", {})
        calls = counts.get("pop_calls", 0)
        per_pop = fmt(counts.get("popped", 0) / calls, 1) if calls else "–"
        cells += [per_pop, fmt(float(counts.get("empty_pops", 0)))]
        out.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    return out


def _fanout_table(results: list[dict[str, Any]]) -> list[str]:
    """Each fan-out window, and consumer groups against each copy approach of its run."""
    rows = [r for r in ran(results) if r["workload"] == "fanout"]
    if not rows:
        return []
    out = [
        "## Fan-out: G consumer groups on one queue against a copy per reader",
        "",
        "groups: producers push batch B into one queue, G consumer groups each pop it (by "
        "queue, consumerGroup) and ack; copy: each push carries its messages into G queues "
        "(Queen: one push call of G·B items; pgmq: a send_batch per queue), each queue "
        "consumed in queue mode. Same producers, consumers per group or queue, batch and "
        "window. deliveries/s = acked per second over all groups (queues); published/s = "
        "messages the producers pushed per second, a copied message counted once.",
        "",
        "| case | deliveries/s | published/s | WAL bytes/delivery | groups / this |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        together = fanout_window(results, "queen", "groups", r["groups"])
        vs = ratio(float(together["msgs_per_s"]) if together else math.nan, r["msgs_per_s"])
        out.append(
            f"| {r['case']} | {fmt(r['msgs_per_s'])} | {fmt(r.get('published_per_s', math.nan))}"
            f" | {fmt(wal_per_message(r))} | {'–' if r is together else fmt(vs, 2)} |"
        )
    return out


def _latency_table(results: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in ran(results) if r["workload"] == "latency"]
    if not rows:
        return []
    out = [
        "## Latency at low load (one client: push 1, pop 1, ack, 5 ms pause; ms)",
        "",
        "| system | pop p50 | pop p90 | pop p99 | ack p50 | ack p99 | push p50 | push p99 | pops |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    shown = [("pop", "p50"), ("pop", "p90"), ("pop", "p99"), ("ack", "p50"), ("ack", "p99"),
             ("push", "p50"), ("push", "p99")]
    for r in rows:
        cells = " | ".join(fmt(latency_of(r, q, op), 2) for op, q in shown)
        pops = r["latency_ms"].get("pop", {}).get("n", 0)
        out.append(f"| {r['system']} | {cells} | {pops} |")
    return out


def _backlog_table(results: list[dict[str, Any]]) -> list[str]:
    rows = sorted(
        (r for r in ran(results) if r["workload"] == "backlog"), key=lambda r: r["backlog"]
    )
    mem = [r for r in ran(results) if r["workload"] == "memory"]
    out: list[str] = []
    if rows:
        out += [
            "## Backlog scale (Queen, pop by queue, batch 1, one consumer; ms)",
            "",
            "| pending | pop p50 | pop p99 | ack p50 | seeding (s) |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            pop, ack = r["latency_ms"].get("pop", {}), r["latency_ms"].get("ack", {})
            out.append(
                f"| {r['backlog']:,} | {fmt(pop.get('p50', math.nan), 2)} | "
                f"{fmt(pop.get('p99', math.nan), 2)} | {fmt(ack.get('p50', math.nan), 2)}"
                f" | {r.get('seed_seconds')} |"
            )
    for r in mem:
        mb = {k: v / 2**20 for k, v in r["server_rss"].items()}
        before = {k: v / 2**20 for k, v in r["rss_before"].items()}
        out += [
            "",
            f"## Server memory with {r['backlog']:,} queued",
            "",
            "| process | RSS before (MB) | RSS after e2e over the backlog (MB) |",
            "|---|---:|---:|",
        ]
        out += [f"| {k} | {fmt(before.get(k, math.nan), 1)} | {fmt(v, 1)} |" for k, v in mb.items()]
        out.append(f"\nThroughput during that run: {fmt(r['msgs_per_s'])} msg/s.")
    return out


def _cpu_table(results: list[dict[str, Any]]) -> list[str]:
    out = [
        "## Where the CPU went (share of the whole machine, 100% = both cores)",
        "",
        "client = load generator; server = gunicorn workers (or RabbitMQ); postgres = "
        "backends of the bench database; pg bg = WAL writer, checkpointer, autovacuum; "
        "other = everything else on the machine (other users).",
        "",
        "| case | msg/s | client | server | postgres | pg bg | other | idle | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ran(results):
        c = r.get("cpu", {})
        cells = [
            f"{100 * c.get(k, 0):.0f}%"
            for k in ("client", "server", "postgres", "pg_background", "other", "idle")
        ]
        out.append(
            f"| {r['case']} | {fmt(r['msgs_per_s'])} | "
            + " | ".join(cells)
            + f" | {r['counts'].get('errors', 0)} |"
        )
    return out


def _cpu_per_message_table(results: list[dict[str, Any]]) -> list[str]:
    rows = []
    for r in ran(results):
        c = cpu_per_message(r) if r["workload"] in ("push", "e2e", "fanout") else None
        if c is not None:
            rows.append((r, c))
    if not rows:
        return []
    out = [
        "## CPU and WAL per message (µs, both cores' time over the messages of the window)",
        "",
        "postgres includes its background processes; other users' CPU is left out. WAL "
        "bytes/msg: the server's WAL over the window per message pushed (push cases) or "
        "acked (the others), every database's WAL counted.",
        "",
        "| case | msg/s | client | server | postgres | all | WAL bytes/msg |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r, c in rows:
        cells = " | ".join(fmt(c[k], 1) for k in (*CPU_PARTS, "all"))
        out.append(
            f"| {r['case']} | {fmt(r['msgs_per_s'])} | {cells} | {fmt(wal_per_message(r))} |"
        )
    allowed = budgets(results)
    if allowed:
        out += [
            "",
            "Throughput goals as CPU budgets: the CPU per message at which Queen would "
            "reach each goal at these windows' baseline rates.",
            "",
            "| case | goal | allows (µs) | Queen now (µs) | less CPU it needs |",
            "|---|---|---:|---:|---:|",
        ]
        for workload, batch, goal, budget, now in allowed:
            cut = max(0.0, 1 - budget / now) if now > 0 else math.nan
            out.append(
                f"| {workload} batch {batch} | {goal} | {fmt(budget, 1)} | {fmt(now, 1)} "
                f"| {fmt(100 * cut)} % |"
            )
    return out


def _rounds_table(results: list[dict[str, Any]], numbers: list[int]) -> list[str]:
    """Every push and end-to-end case's rate in each round, and their median."""
    by_case: dict[str, dict[int, float]] = {}
    for r in ran(results):
        if r["workload"] in ("push", "e2e", "fanout"):
            by_case.setdefault(r["case"], {})[round_of(r)] = float(r["msgs_per_s"])
    if not by_case:
        return []
    out = [
        "## Rounds (messages/s)",
        "",
        "Every round's window of each push, end-to-end and fan-out case; median of the "
        "rounds' rates.",
        "",
        "| case | " + " | ".join(f"round {n}" for n in numbers) + " | median |",
        "|---|" + "---:|" * (len(numbers) + 1),
    ]
    for case, got in by_case.items():
        cells = [fmt(got.get(n, math.nan)) for n in numbers]
        out.append(
            f"| {case} | " + " | ".join(cells) + f" | {fmt(statistics.median(got.values()))} |"
        )
    return out


# --------------------------------------------------------------------------- plots


def plots(out_dir: Path, mode: str, results: list[dict[str, Any]]) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []

    paths = []
    for extra in (report_pgbound.plot, report_small.plot):
        path = extra(plt, out_dir, mode, results)
        if path is not None:
            paths.append(path)
    results = report_small.others(report_pgbound.others(results))
    if _throughput_plot(plt, out_dir, mode, results):
        paths.append(out_dir / f"throughput-{mode}.png")
    paths += _latency_plot(plt, out_dir, mode, results)
    cpu_path = _cpu_plot(plt, out_dir, mode, results)
    if cpu_path is not None:
        paths.append(cpu_path)
    return paths


def _throughput_plot(plt: Any, out_dir: Path, mode: str, results: list[dict[str, Any]]) -> bool:
    """Push and end-to-end rates by batch size, one line per system; False with neither."""
    if not [r for r in ran(results) if r["workload"] in ("push", "e2e")]:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, workload, title in (
        (axes[0], "push", "Push only"),
        (axes[1], "e2e", "End to end (push, pop, ack)"),
    ):
        series: dict[str, list[tuple[int, float]]] = {}
        for r in ran(results):
            if r["workload"] != workload:
                continue
            name = r["system"]
            if workload == "e2e" and name == "queen":
                name = f"queen p{r['partitions']}"
            series.setdefault(name, []).append((r["batch"], r["msgs_per_s"]))
        for name, points in sorted(series.items()):
            points.sort()
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="o",
                label=name,
                linewidth=2.5 if name.startswith("queen") else 1.2,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("messages / s")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if series:
            ax.legend(fontsize=8)
    fig.suptitle(f"Throughput by batch size ({mode}, 2 cores, one PostgreSQL)")
    fig.tight_layout()
    fig.savefig(out_dir / f"throughput-{mode}.png", dpi=110)
    plt.close(fig)
    return True


def _latency_plot(plt: Any, out_dir: Path, mode: str, results: list[dict[str, Any]]) -> list[Path]:
    paths = []
    rows = [r for r in ran(results) if r["workload"] in ("latency", "backlog")]
    if rows:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        labels = [
            r["system"] if r["workload"] == "latency" else f"queen {r['backlog']:,} pending"
            for r in rows
        ]
        width = 0.2
        bars = [("pop", "p50"), ("pop", "p90"), ("pop", "p99"), ("push", "p50")]
        for i, (op, q) in enumerate(bars):
            ax.bar(
                [x + (i - 1.5) * width for x in range(len(rows))],
                [latency_of(r, q, op) for r in rows],
                width,
                label=f"{op} {q}",
            )
        ax.set_xticks(range(len(rows)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("ms")
        ax.set_title(f"Latency at low load ({mode})")
        ax.axhline(2, color="grey", linestyle=":", linewidth=1)
        ax.axhline(10, color="grey", linestyle="--", linewidth=1)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"latency-{mode}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _cpu_plot(plt: Any, out_dir: Path, mode: str, results: list[dict[str, Any]]) -> Path | None:
    """Stacked CPU per message of every system end to end at batch 100 and 1, with budgets."""
    panels = []
    for batch in (100, 1):
        bars = []
        for r in ran(results):
            if r["workload"] != "e2e" or r["batch"] != batch:
                continue
            if r["system"] == "queen" and r["partitions"] != HEADLINE_PARTITIONS:
                continue
            c = cpu_per_message(r)
            if c is not None:
                bars.append((r["system"], c))
        if bars:
            lines = [(g, b) for w, n, g, b, _ in budgets(results) if w == "e2e" and n == batch]
            panels.append((batch, sorted(bars, key=lambda x: x[1]["all"]), lines))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    colors = {"client": "#9ecae1", "server": "#3182bd", "postgres": "#fd8d3c"}
    for ax, (batch, bars, lines) in zip(axes[0], panels, strict=True):
        names = [name for name, _ in bars]
        left = [0.0] * len(bars)
        for part in CPU_PARTS:
            widths = [c[part] for _, c in bars]
            ax.barh(names, widths, left=left, color=colors[part], label=part)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        for style, (goal, budget) in zip((":", "--", "-."), lines, strict=False):
            ax.axvline(budget, color="black", linestyle=style, linewidth=1, label=f"Queen {goal}")
        ax.set_xlabel("CPU µs per message (both cores)")
        ax.set_title(f"End to end, batch {batch} (Queen p{HEADLINE_PARTITIONS})")
        ax.grid(True, axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Where the CPU of a message goes ({mode}; budgets: the goals' rates)")
    fig.tight_layout()
    path = out_dir / f"cpu-{mode}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(
    out_dir: Path, mode: str, results: list[dict[str, Any]], facts: dict[str, Any]
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"RESULTS-{mode}.md"
    md.write_text(markdown(mode, results, facts))
    raw = out_dir / f"results-{mode}.json"
    raw.write_text(json.dumps({"conditions": facts, "results": results}, indent=1, default=str))
    return [md, raw, *plots(out_dir, mode, median_windows(results))]


def hosts(facts: dict[str, Any]) -> str:
    """The words before "gunicorn" in a report's conditions: "N hosts, each " for a run with
    several Queen servers (--queen-hosts), else none."""
    n = facts.get("queen_hosts") or 1
    return f"{n} hosts, each " if n > 1 else ""
