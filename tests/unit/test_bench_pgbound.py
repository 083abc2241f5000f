"""The PostgreSQL-bound phase: the CPU quota it runs the cluster under, its cases, and its
place in a report."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench import __main__ as bench
from bench import pgquota, profiles, report, report_pgbound

SYSTEMS = ["queen", "minimal", "raw", "pgmq"]


def test_a_quota_holds_a_busy_process_to_its_share_of_a_core(tmp_path):
    reason = pgquota.unavailable()
    if reason:
        pytest.skip(reason)
    quota = pgquota.CpuQuota(0.2, 20_000, name=f"queen-test-{tmp_path.name}")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        quota.add([spinner.pid])
        assert spinner.pid in quota.pids()
        started, before = time.monotonic(), quota.usage_s()
        time.sleep(1.5)
        used, elapsed = quota.usage_s() - before, time.monotonic() - started
        periods, throttled = quota.throttled()
    finally:
        spinner.kill()
        spinner.wait()
        quota.remove()
    # The kernel enforces the ceiling whatever else runs; a busy process is throttled.
    assert 0 < used <= 0.2 * elapsed * 1.25 + 0.02
    assert periods > 0 and throttled > 0
    assert not any(d.exists() for d in quota.dirs)


def test_no_quota_without_a_positive_share():
    with pytest.raises(ValueError):
        pgquota.CpuQuota(0)


def test_the_phase_runs_every_goal_shape_for_each_system_and_fanout_for_queen():
    ctx = bench.Context(profiles.FULL, "postgresql://unused", "amqp://unused", "t",
                        systems=SYSTEMS)
    cases = bench.plan_pgbound(ctx, 4)
    assert all(c.phase == "pgbound" and c.extra["async_acks"] for c in cases)
    shapes = {(c.workload, c.batch, c.producers, c.consumers) for c in cases if c.system == "raw"}
    assert shapes == {
        ("push", 1, 64, 0), ("push", 1000, 8, 0),
        ("e2e", 1, 32, 32), ("e2e", 10, 32, 32), ("e2e", 100, 2, 4), ("e2e", 1000, 2, 4),
    }
    for system in SYSTEMS:
        assert {
            (c.workload, c.batch) for c in cases if c.system == system and c.workload != "fanout"
        } == {(w, b) for w, b, _, _ in shapes}
    for c in cases:  # a client process waits with 4 batches a consumer pushed, not acked
        if c.workload == "e2e":
            assert c.extra["backlog_cap"] == 4 * c.batch * c.consumers
    fanout = [c for c in cases if c.workload == "fanout"]
    assert {(c.system, c.extra["variant"], c.extra["groups"]) for c in fanout} == {
        ("queen", "groups", 4), ("queen", "copy", 4)
    }


def window(system: str, workload: str, batch: int, rate: float, **extra: Any) -> dict[str, Any]:
    return {
        "case": f"{system}/{workload}/b{batch}", "system": system, "workload": workload,
        "batch": batch, "partitions": 16, "producers": 2, "consumers": 4, "phase": "pgbound",
        "msgs_per_s": rate, "round": 1, **extra,
    }


RESULTS = [
    window("queen", "e2e", 100, 30_000, wal_bytes_per_msg=400, pg_tuples_fetched_per_msg=2.5,
           counts={"pushed": 150_000, "acked": 150_000},
           pg_cpu_us_per_msg=15.0, pg_cores=0.5, pg_throttled_share=0.98,
           pg_cpu_us_per_msg_by_role={"queen": 11.0, "autovacuum worker": 2.5, "walwriter": 1.5},
           pg_top_statements=[{"query": "SELECT x.pop FROM queen.pop_many($1)",
                               "calls_per_msg": 0.01, "exec_us_per_msg": 6.5}],
           server={"statements_per_msg": 0.061, "commits_per_msg": 0.07,
                   "requests_per_call": {"push": 1.5, "pop": 2.25}}),
    window("raw", "e2e", 100, 12_000, wal_bytes_per_msg=1_000, pg_cpu_us_per_msg=40.0,
           pg_cpu_us_per_msg_by_role={"client": 38.0, "walwriter": 2.0},
           counts={"pushed": 90_000, "acked": 60_000}),
    window("minimal", "e2e", 100, 32_000, wal_bytes_per_msg=380),
    window("queen", "push", 1, 1_000),
    window("raw", "push", 1, 500),
    window("queen", "fanout", 100, 30_000, variant="groups"),
    window("queen", "fanout", 100, 10_000, variant="copy"),
]


def test_goals_compare_queen_with_each_baseline_of_the_same_round():
    rows = {name: (value, met) for name, value, _, met in report_pgbound.goal_rows(RESULTS)}
    assert rows["PG-bound: e2e batch 100 / raw"] == (2.5, True)
    value, met = rows["PG-bound: e2e batch 100 / minimal cursor SQL"]
    assert value == pytest.approx(30 / 32) and met is True
    assert rows["PG-bound: push batch 1 / raw"] == (2.0, False)
    assert rows["PG-bound: fan-out 4 groups / copy"] == (3.0, True)
    assert rows["PG-bound: tuples fetched/msg e2e batch 100"] == (2.5, True)
    assert rows["PG-bound: WAL/msg e2e batch 100 / raw's"] == (0.4, True)
    value, met = rows["PG-bound: e2e batch 1 / raw"]
    assert math.isnan(value) and met is None  # no window of that shape


def test_a_report_shows_the_phase_first_and_keeps_it_out_of_the_whole_machine_tables():
    facts = {"pg_quota": {"cpus": 0.5, "period_ms": 20.0}, "rounds": 1}
    text = report.markdown("t", RESULTS, facts)
    assert "## PostgreSQL as the bottleneck" in text
    assert "CPU quota of 0.5 core" in text
    assert "| e2e batch 100 | 2 + 4 | 30,000 | 32,000 | 12,000 | 2.50 | 0.94 |" in text
    assert "| queen/e2e/b100 | 30,000 | 1.00 | 15.0 | 2.5 | 400 |" in text
    assert "| raw/e2e/b100 | 12,000 | 1.50 | 40.0 |" in text  # producers ahead
    assert "| queen/push/b1 | 1,000 | – |" in text
    assert "| queen/e2e/b100 | `SELECT x.pop FROM queen.pop_many($1)` | 0.01 | – | 6.5 | – |" in text
    assert "| queen/e2e/b100 | 0.06 | 0.07 | 1.50 | 2.25 | – |" in text  # the server's count
    assert "## Push only" not in text and "## End to end" not in text
    assert "e2e batch 100 (p16) / raw ceiling" not in text  # whole-machine goals left out


def test_the_server_s_counts_of_a_window_are_per_message_and_per_call():
    from bench.runner import server_per_message

    before = {"statements": 100, "commits": 90, "fusion": {"push": (10, 10), "pop": (5, 9)},
              "parked": 4, "wakeup_calls": 20}
    after = {"statements": 160, "commits": 130, "fusion": {"push": (30, 70), "pop": (5, 9)},
             "parked": 14, "wakeup_calls": 70}
    assert server_per_message(before, after, 200) == {
        "statements_per_msg": 0.3, "commits_per_msg": 0.2, "requests_per_call": {"push": 3.0},
        "parked_per_msg": 0.05, "wakeup_calls_per_msg": 0.25,
    }


def test_top_statements_are_the_window_s_busiest_per_message():
    meter = pgquota.PgMeter.__new__(pgquota.PgMeter)
    meter.statement_edges = [
        {1: (10, 5.0, 30, 10, "push"), 2: (4, 1.0, 8, 300, "pop")},
        {1: (110, 25.0, 330, 110, "push"), 2: (54, 41.0, 508, 3300, "pop"),
         3: (1, 0.1, 1, 0, "new")},
    ]
    top = meter._top(100)
    assert [s["query"] for s in top] == ["pop", "push", "new"]
    assert top[0] == {
        "query": "pop", "calls_per_msg": 0.5, "exec_us_per_msg": 400.0, "blocks_per_msg": 5.0,
        "rows_per_call": 60.0,
    }


def test_cpu_by_role_counts_new_processes_whole_and_the_rest_as_exited():
    before = {10: ("queen", 1_000_000_000), 11: ("walwriter", 0), 12: ("queen", 500_000_000)}
    after = {10: ("queen", 1_600_000_000), 11: ("walwriter", 100_000_000),
             13: ("autovacuum worker", 200_000_000)}  # 12 exited, 13 started
    spent = pgquota.by_role(before, after, total_s=1.0)
    assert spent == pytest.approx(
        {"queen": 0.6, "walwriter": 0.1, "autovacuum worker": 0.2, pgquota.EXITED: 0.1})


def test_a_report_shows_where_each_case_s_cpu_went_by_role():
    text = report.markdown("t", RESULTS, {"pg_quota": {"cpus": 0.5, "period_ms": 20.0}})
    assert "| case | queen | autovacuum worker | walwriter |" in text  # costliest first
    assert "| queen/e2e/b100 | 11.0 | 2.5 | 1.5 |" in text
    assert "| raw/e2e/b100 | 38.0" not in text  # (its load's backends are gone by then)


@pytest.mark.skipif(not (Path("/proc/self/schedstat").exists()), reason="no schedstat")
def test_a_process_s_cpu_is_read_in_nanoseconds():
    # Spin until the reading moved by 20 ms (however long a loaded machine takes to give
    # this process that much CPU): in any coarser unit it would take seconds, and a single
    # thread's CPU never runs ahead of the wall clock.
    spinning = pgquota.backend_ns(os.getpid())
    assert spinning is not None
    started = time.monotonic()
    spent = 0
    while spent < 20_000_000 and time.monotonic() - started < 10:
        spent = (pgquota.backend_ns(os.getpid()) or 0) - spinning
    assert 20_000_000 <= spent <= (time.monotonic() - started) * 1e9 + 5_000_000
    assert pgquota.backend_ns(2**22 + 1) is None  # beyond any pid: gone
