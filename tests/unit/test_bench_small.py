"""The small phase of the bench: its cases, Queen's pool for them, and its place in a report."""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest

from bench import __main__ as bench
from bench import profiles, report, report_small
from bench.cluster import Cluster

SYSTEMS = ["queen", "raw", "pgmq", "pgqueuer"]


def small_cases(profile: profiles.Profile = profiles.FULL) -> list[Any]:
    ctx = bench.Context(profile, "postgresql://unused", "amqp://unused", "t", systems=SYSTEMS)
    return bench.plan_small(ctx)


def test_the_full_small_phase_drives_32_producers_and_32_consumers_over_several_processes():
    cases = small_cases()
    e2e = [c for c in cases if c.workload == "e2e"]
    push = [c for c in cases if c.workload == "push"]
    assert {(c.system, c.batch) for c in e2e} == {(s, b) for s in SYSTEMS for b in (1, 10)}
    assert {(c.system, c.batch) for c in push} == {(s, 1) for s in SYSTEMS}
    assert all(c.producers >= 32 and c.consumers >= 32 for c in e2e)
    assert all(c.producers >= 64 and c.consumers == 0 for c in push)
    # every system, the async drivers too, gets the same clients over the same processes
    assert {(c.workload, c.batch, c.producers, c.consumers, c.processes) for c in cases} == {
        ("push", 1, 64, 0, 4),
        ("e2e", 1, 32, 32, 4),
        ("e2e", 10, 32, 32, 4),
    }
    assert {c.partitions for c in e2e if c.system == "queen"} == {16}
    assert all(c.phase == "small" for c in cases)


def test_small_cases_are_labelled_apart_from_the_e2e_phases():
    labels = {c.label for c in small_cases()}
    assert "queen/e2e/b1/p16/c32+32" in labels and "raw/push/b1/c64" in labels
    ctx = bench.Context(profiles.FULL, "postgresql://unused", "", "t", systems=SYSTEMS)
    assert not labels & {c.label for c in bench.plan(ctx, {"push", "e2e"})}


def test_queens_pool_gives_each_client_of_the_busiest_case_a_connection():
    cases = small_cases()
    pool = bench.queen_pool(cases)
    assert pool * bench.QUEEN_WORKERS >= 64
    # the clients of the busiest case plus Queen's pools, listeners and maintenance
    # stay well inside the bench cluster's connection limit
    queen = pool * bench.QUEEN_WORKERS + bench.QUEEN_WORKERS + 2
    limit = inspect.signature(Cluster).parameters["max_connections"].default
    assert max(queen, 64) + 10 < limit


def test_fewer_queen_workers_get_a_larger_pool_each():
    cases = small_cases()
    assert bench.parse_args(["--queen-workers", "1"]).queen_workers == 1
    assert bench.parse_args([]).queen_workers == bench.QUEEN_WORKERS
    assert bench.queen_pool(cases, 1) >= 64
    assert bench.queen_pool(cases, 4) * 4 >= 64 and bench.queen_pool(cases, 4) < 64
    assert bench.main(["--queen-workers", "0"]) == 2


def test_several_queen_hosts_share_the_clients_and_say_so_in_the_report():
    from bench.adapters import host_url

    assert bench.parse_args(["--queen-hosts", "2"]).queen_hosts == 2
    assert bench.parse_args([]).queen_hosts == 1
    assert bench.main(["--queen-hosts", "0"]) == 2
    target = {"url": "http://a", "urls": ["http://a", "http://b"]}
    assert [host_url(target, {"client_index": i}) for i in range(4)] == [
        "http://a", "http://b", "http://a", "http://b"]
    assert host_url({"url": "http://a"}, {"client_index": 3}) == "http://a"
    text = report.markdown("t", mixed(), {"queen_workers": 1, "queen_hosts": 2})
    assert "- Queen: 2 hosts, each gunicorn, 1 gevent workers" in text
    assert "- Queen: gunicorn, 2 gevent workers" in report.markdown("t", mixed(), {})


def test_runs_without_many_clients_keep_queens_default_pool():
    ctx = bench.Context(profiles.FULL, "postgresql://unused", "", "t", systems=SYSTEMS)
    assert bench.queen_pool(bench.plan(ctx, {"push", "e2e"})) == bench.QUEEN_DEFAULT_POOL
    assert bench.queen_pool([]) == bench.QUEEN_DEFAULT_POOL


def window(system: str, workload: str, batch: int, rate: float, phase: str = "", **extra: Any):
    partitions = 16 if system == "queen" and workload == "e2e" else 1
    clients = (64, 0) if workload == "push" else (32, 32)
    label = f"{system}/{workload}/b{batch}" + (f"/p{partitions}" if workload == "e2e" else "")
    return {
        "case": label + (f"/c{clients[0]}+{clients[1]}" if phase else ""),
        "system": system,
        "workload": workload,
        "batch": batch,
        "partitions": partitions,
        "producers": clients[0],
        "consumers": clients[1],
        "processes": 4,
        "msgs_per_s": rate,
        "latency_ms": {"push": {"p50": 2.0, "p99": 9.0, "n": 10}},
        "cpu": {"client": 0.1, "server": 0.3, "postgres": 0.5},
        "cores": 2,
        "counts": {"errors": 0},
        "backends": 70 if system == "queen" else 64,
        **({"phase": phase} if phase else {}),
        **extra,
    }


def mixed() -> list[dict[str, Any]]:
    """The e2e phase at batch 1 beside the small phase's windows of the same shapes."""
    return [
        window("queen", "e2e", 1, 400),
        window("raw", "e2e", 1, 4000),
        window("queen", "push", 1, 1000, "small"),
        window("raw", "push", 1, 10_000, "small"),
        window("pgmq", "push", 1, 5000, "small"),
        window("queen", "e2e", 1, 600, "small"),
        window("raw", "e2e", 1, 3000, "small"),
        window("pgmq", "e2e", 1, 1200, "small"),
        window("queen", "e2e", 10, 5000, "small"),
        window("raw", "e2e", 10, 20_000, "small"),
    ]


def goal(rows: list, prefix: str) -> tuple:
    (row,) = [r for r in rows if r[0].startswith(prefix)]
    return row


def test_the_small_goal_compares_the_small_windows_and_the_others_stay_apart():
    rows = report.goals(mixed())
    assert goal(rows, "small phase: e2e batch 1 / raw")[1:4] == (0.2, ">= 0.5", False)
    assert goal(rows, "e2e batch 1 (p16) / raw")[1] == 0.1  # the e2e phase's own windows


def test_a_run_without_the_small_phase_leaves_its_goal_unmeasured():
    rows = report.goals(report_small.others(mixed()))
    _, value, _, met, _ = goal(rows, "small phase")
    assert math.isnan(value) and met is None


def test_the_report_shows_the_small_cases_with_ratios_to_raw_and_pgmq():
    facts = {"queen_workers": 2, "queen_pool": 32}
    text = report.markdown("t", mixed(), facts)
    section = text.split("## Small batches at high concurrency")[1].split("\n## ")[0]
    assert "| push batch 1 | 64 producers | 1,000 | 10,000 | 5,000 | 0.10 | 0.20 |" in section
    assert "| e2e batch 1 | 32 + 32 | 600 | 3,000 | 1,200 | 0.20 | 0.50 |" in section
    assert "| e2e batch 10 | 32 + 32 | 5,000 | 20,000 | – | 0.25 | – |" in section
    assert "over 4 client processes" in section and "DB_POOL_SIZE 32 each" in section
    assert "| queen/e2e/b1/p16/c32+32 | 2.0 / 9.0 | – | – | 70 | 0 |" in section
    assert "DB_POOL_SIZE 32 per worker" in text
    # the end-to-end table keeps the e2e phase's windows only
    e2e = text.split("## End to end")[1].split("\n## ")[0]
    assert "| 1 | 400 | 4,000 | 0.10 |" in e2e and "600" not in e2e


def test_the_small_phase_has_its_own_plot(tmp_path):
    pytest.importorskip("matplotlib")
    paths = report.plots(tmp_path, "t", report_small.windows(mixed()))
    assert paths == [tmp_path / "small-t.png"]  # no empty throughput plot beside it
    assert paths[0].stat().st_size > 10_000


def test_the_quick_mode_runs_the_small_phase_on_queen_raw_and_pgmq_only():
    assert {c.system for c in small_cases(profiles.QUICK)} == {"queen", "raw", "pgmq"}
