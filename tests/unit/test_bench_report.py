"""The benchmark report over several rounds: goals per round, tables from median windows."""

from __future__ import annotations

import math
from typing import Any

from bench import report


def window(system: str, workload: str, batch: int, rate: float, rnd: int, **extra: Any) -> dict:
    partitions = 16 if system == "queen" and workload == "e2e" else 1
    label = f"{system}/{workload}/b{batch}" + (f"/p{partitions}" if workload == "e2e" else "")
    return {
        "case": label,
        "system": system,
        "workload": workload,
        "batch": batch,
        "partitions": partitions,
        "msgs_per_s": rate,
        "latency_ms": extra.pop("latency_ms", {}),
        "cpu": {"client": 0.1, "server": 0.3, "postgres": 0.5, "idle": 0.01},
        "counts": {"errors": 0},
        "round": rnd,
        **extra,
    }


def three_rounds() -> list[dict]:
    # Round 2 is slow for every system alike: its ratio is what a side-by-side round gives.
    results = []
    for rnd, (queen, raw) in enumerate([(20_000, 40_000), (10_000, 25_000), (18_000, 40_000)], 1):
        results.append(window("queen", "e2e", 100, queen, rnd))
        results.append(window("raw", "e2e", 100, raw, rnd))
    return results


def goal(rows: list, prefix: str) -> tuple:
    (row,) = [r for r in rows if r[0].startswith(prefix)]
    return row


def test_a_goal_is_the_median_of_each_rounds_side_by_side_ratio():
    name, value, target, met, per_round = goal(
        report.goals(three_rounds()), "e2e batch 100 (p16) / raw"
    )
    assert per_round == [0.5, 0.4, 0.45]
    assert value == 0.45  # not 18,000 / 40,000 of the median rates, nor a ratio across rounds
    assert (target, met) == (">= 0.6", False)


def test_a_goal_met_by_its_median_round_is_met():
    results = [
        window("queen", "e2e", 100, q, rnd) for rnd, q in enumerate([30_000, 20_000, 26_000], 1)
    ] + [window("raw", "e2e", 100, 40_000, rnd) for rnd in (1, 2, 3)]
    *_, met, per_round = goal(report.goals(results), "e2e batch 100 (p16) / raw")
    assert per_round == [0.75, 0.5, 0.65] and met is True


def test_goals_of_one_round_have_no_per_round_values():
    results = [r for r in three_rounds() if r["round"] == 1]
    _, value, _, _, per_round = goal(report.goals(results), "e2e batch 100 (p16) / raw")
    assert value == 0.5 and per_round == []


def test_goals_missing_from_every_round_stay_unmeasured():
    _, value, _, met, per_round = goal(report.goals(three_rounds()), "e2e batch 100 (p16) / pgmq")
    assert math.isnan(value) and met is None and per_round == []


def test_tables_show_the_window_with_the_median_rate():
    shown = report.median_windows(three_rounds())
    assert {(r["system"], r["msgs_per_s"], r["round"]) for r in shown} == {
        ("queen", 18_000, 3),
        ("raw", 40_000, 1),
    }


def test_an_even_count_shows_the_lower_middle_and_failed_windows_do_not_count():
    runs = [window("queen", "push", 1000, rate, rnd) for rnd, rate in enumerate([5, 9, 7, 3], 1)]
    failed = {**window("queen", "push", 1000, 0, 5), "failed": "RuntimeError: boom"}
    (shown,) = report.median_windows([*runs, failed])
    assert shown["msgs_per_s"] == 5


def test_a_case_that_failed_in_every_round_is_shown_failed():
    failed = [{**window("raw", "push", 1, 0, rnd), "failed": "boom"} for rnd in (1, 2)]
    (shown,) = report.median_windows(failed)
    assert shown["failed"] == "boom"


def test_latency_cases_show_their_median_pop_p50():
    runs = [
        window("queen", "latency", 1, 100, rnd, latency_ms={"pop": {"p50": p50, "p99": 3.0}})
        for rnd, p50 in enumerate([2.5, 1.5, 1.9], 1)
    ]
    (shown,) = report.median_windows(runs)
    assert shown["latency_ms"]["pop"]["p50"] == 1.9


def test_the_report_lists_every_round_and_the_goals_rounds():
    text = report.markdown("full", three_rounds(), {"rounds": 3})
    assert "| goal | measured (median) | rounds | target | met |" in text
    assert (
        "| e2e batch 100 (p16) / raw ceiling | 0.45 | 0.50 / 0.40 / 0.45 | >= 0.6 | **no** |"
        in text
    )
    assert "## Rounds (messages/s)" in text
    assert "| queen/e2e/b100/p16 | 20,000 | 10,000 | 18,000 | 18,000 |" in text
    # the end-to-end table shows the median windows, not the first round
    assert "| 100 | 18,000 | 40,000 | 0.45 |" in text


def test_a_report_of_one_round_keeps_its_plain_goals_table():
    text = report.markdown("quick", [r for r in three_rounds() if r["round"] == 1], {})
    assert "| goal | measured | target | met |" in text
    assert "## Rounds" not in text
