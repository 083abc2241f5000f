"""The benchmark harness runs end to end in its tiny mode against a fresh database.

Marked slow: it takes 20-40 s (two rounds of eight one-second cases, each in a fresh
load-generator process, plus seeding and a gunicorn start), over the 20 s budget of the
default run. The second test runs it once on a cluster the bench starts itself (initdb,
default settings), as the goals are measured; the third only its fan-out phase there,
with pgmq's copy approach beside Queen's; then only its small phase (many clients at
batches of 1 and 10), 10-20 s; the last its PostgreSQL-bound phase on its own cluster
under a CPU quota (root only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import pgquota
from bench.cluster import pg_bin
from tests.conftest import ROOT


def run_smoke(
    out: Path, *server: str, rounds: int = 1, systems: tuple[str, ...] = ("queen", "raw")
) -> tuple[str, list[dict[str, Any]]]:
    """Run `python -m bench --smoke` on server (its arguments, and any more); return the
    report and results, after checking that none failed."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--smoke",
            "--rounds",
            str(rounds),
            "--no-progress",
            *server,
            "--db-prefix",
            f"queen_bench_smoke_{os.getpid()}",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = (out / "RESULTS-smoke.md").read_text()
    results = json.loads((out / "results-smoke.json").read_text())["results"]
    assert {r["system"] for r in results} == set(systems)
    assert not [r for r in results if "failed" in r]
    return report, results


@pytest.mark.slow
def test_bench_smoke(server_dsn, tmp_path):
    report, results = run_smoke(tmp_path, "--dsn", server_dsn, rounds=2)
    for heading in (
        "## Goals",
        "## Push only",
        "## End to end",
        "## Latency at low load",
        "## Backlog scale",
        "## Server memory",
        "## Fan-out",
        "## Where the CPU went",
        "## Rounds",
    ):
        assert heading in report
    assert "(existing server at " in report
    # every push, e2e and latency case ran once per round; backlog and memory once
    rounds: dict[str, list[int]] = {}
    for r in results:
        rounds.setdefault(r["case"], []).append(r.get("round", 1))
    for case, seen in rounds.items():
        once = "/backlog/" in case or "/memory/" in case
        assert sorted(seen) == ([1] if once else [1, 2]), case
    for r in results:
        if r["workload"] in ("push", "e2e", "fanout", "memory"):
            assert r["msgs_per_s"] > 0, r["case"]
            assert r["counts"]["errors"] == 0, r["errors"]
    variants = {r["variant"] for r in results if r["workload"] == "fanout"}
    assert variants == {"groups", "copy"}


def fanout_delivers_every_message_to_each_group(results: list[dict[str, Any]]) -> None:
    """Each fan-out window acked about G deliveries per published message, with its WAL."""
    fanout = [r for r in results if r["workload"] == "fanout"]
    assert fanout
    for r in fanout:
        assert r["groups"] == 4 and r["counts"]["errors"] == 0, r
        # a backlog of at most a few batches is in flight at either edge of the window
        assert r["counts"]["acked"] == pytest.approx(4 * r["counts"]["pushed"], rel=0.5), r
        assert r["wal_bytes"] > 0 and r["wal_bytes_per_msg"] > 0, r


@pytest.mark.slow
def test_bench_smoke_on_its_own_cluster(tmp_path):
    if pg_bin() is None:
        pytest.skip("no PostgreSQL binaries for a cluster of the bench's own")
    report, results = run_smoke(tmp_path, "--cluster")
    assert "(cluster started by the bench, default settings): autovacuum on" in report
    backlog = [r for r in results if r["workload"] == "backlog"]
    # the seeded backlog (bench/backlog.py) is what the pops found
    assert backlog and all(r["counts"]["popped"] > 0 for r in backlog), backlog
    assert all(r["counts"]["empty_pops"] == 0 for r in backlog), backlog
    # the server's WAL over each window, per message (the bench's own cluster: only its WAL)
    for r in results:
        if r["workload"] in ("push", "e2e"):
            assert r["wal_bytes_per_msg"] > 0, r["case"]
    assert "| WAL bytes/msg e2e batch 100 (p16) |" in report
    assert "fan-out 4 groups / copy approach" in report
    fanout_delivers_every_message_to_each_group(results)


@pytest.mark.slow
def test_bench_fanout_against_pgmq_on_its_own_cluster(tmp_path):
    if pg_bin() is None:
        pytest.skip("no PostgreSQL binaries for a cluster of the bench's own")
    pytest.importorskip("pgmq")
    report, results = run_smoke(
        tmp_path,
        "--cluster",
        "--only",
        "fanout",
        "--systems",
        "queen,pgmq",
        systems=("queen", "pgmq"),
    )
    assert {(r["system"], r["variant"]) for r in results} == {
        ("queen", "groups"),
        ("queen", "copy"),
        ("pgmq", "copy"),
    }
    fanout_delivers_every_message_to_each_group(results)
    assert "| pgmq/fanout-copy/b100/g4/p16 |" in report


SMALL_SHAPES = (("push", 1), ("e2e", 1), ("e2e", 10))  # (workload, batch) of the small phase


@pytest.mark.slow
def test_bench_small_phase(server_dsn, tmp_path):
    report, results = run_smoke(tmp_path, "--dsn", server_dsn, "--only", "small")
    shapes = {(r["system"], r["workload"], r["batch"]) for r in results}
    assert shapes == {(s, w, b) for s in ("queen", "raw") for w, b in SMALL_SHAPES}
    for r in results:
        assert r["phase"] == "small" and r["processes"] == 2, r["case"]
        assert r["msgs_per_s"] > 0 and r["counts"]["errors"] == 0, (r["case"], r["errors"])
        assert r["producers"] == (8 if r["workload"] == "push" else 4), r["case"]
        assert r["backends"] > 0, r["case"]
    e2e = [r for r in results if r["workload"] == "e2e"]
    # every push, pop and ack of the end-to-end windows answered; Queen over its partitions
    assert all(r["counts"]["acked"] > 0 and r["counts"]["popped"] > 0 for r in e2e), e2e
    assert {r["partitions"] for r in e2e if r["system"] == "queen"} == {4}
    section = report.split("## Small batches at high concurrency")[1].split("\n## ")[0]
    assert "| queen | raw | queen / raw | queen / pgmq |" in section
    for row in ("| push batch 1 | 8 producers |", "| e2e batch 1 | 4 + 4 |", "| e2e batch 10 |"):
        assert row in section
    assert "| small phase: e2e batch 1 / raw ceiling |" in report
    assert "DB_POOL_SIZE 10 per worker" in report  # few clients: Queen's default
    assert (tmp_path / "small-smoke.png").exists()
    assert not (tmp_path / "throughput-smoke.png").exists()


@pytest.mark.slow
def test_bench_pgbound_phase_runs_its_cluster_under_the_quota(tmp_path):
    if pg_bin() is None:
        pytest.skip("no PostgreSQL binaries for a cluster of the bench's own")
    reason = pgquota.unavailable()
    if reason:
        pytest.skip(reason)
    report, results = run_smoke(
        tmp_path, "--pg-cpus", "0.5", "--systems", "queen,minimal,raw",
        systems=("queen", "minimal", "raw"),
    )
    assert "## PostgreSQL as the bottleneck" in report
    assert "CPU quota of 0.5 core" in report
    assert "PG-bound: e2e batch 100 / minimal cursor SQL" in report
    assert all(r.get("phase") == "pgbound" for r in results)
    for r in results:
        assert r["msgs_per_s"] > 0 and r["counts"]["errors"] == 0, r["case"]
        assert r["pg_cpu_us_per_msg"] > 0 and r["pg_statements_per_msg"] > 0, r["case"]
        # the cluster's CPU stays within its quota (a little over: accounting granularity)
        assert r["pg_cores"] <= 0.5 * 1.2, r["case"]
