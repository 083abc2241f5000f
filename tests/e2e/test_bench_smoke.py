"""The benchmark harness runs end to end in its tiny mode against a fresh database.

Marked slow: it takes 20-40 s (two rounds of six one-second cases, each in a fresh
load-generator process, plus seeding and a gunicorn start), over the 20 s budget of the
default run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_bench_smoke(server_dsn, tmp_path):
    prefix = f"queen_bench_smoke_{os.getpid()}"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--smoke",
            "--rounds",
            "2",
            "--no-progress",
            "--dsn",
            server_dsn,
            "--db-prefix",
            prefix,
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = (tmp_path / "RESULTS-smoke.md").read_text()
    for heading in (
        "## Goals",
        "## Push only",
        "## End to end",
        "## Pop latency",
        "## Backlog scale",
        "## Server memory",
        "## Where the CPU went",
        "## Rounds",
    ):
        assert heading in report
    results = json.loads((tmp_path / "results-smoke.json").read_text())["results"]
    assert {r["system"] for r in results} == {"queen", "raw"}
    assert not [r for r in results if "failed" in r]
    # every push, e2e and latency case ran once per round; backlog and memory once
    rounds: dict[str, list[int]] = {}
    for r in results:
        rounds.setdefault(r["case"], []).append(r.get("round", 1))
    for case, seen in rounds.items():
        once = "/backlog/" in case or "/memory/" in case
        assert sorted(seen) == ([1] if once else [1, 2]), case
    for r in results:
        if r["workload"] in ("push", "e2e", "memory"):
            assert r["msgs_per_s"] > 0, r["case"]
            assert r["counts"]["errors"] == 0, r["errors"]
