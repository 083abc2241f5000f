"""bench.pycost --http: the side-by-side table of worker CPU per request."""

from __future__ import annotations

import argparse

from bench import pycost


def test_the_table_shows_each_trees_median_and_its_ratio_to_the_first() -> None:
    costs = {
        "before": {"push": [100.0, 120.0, 110.0], "pop": [200.0, 200.0, 210.0], "ack": [90.0]},
        "after": {"push": [90.0, 80.0, 100.0], "pop": [150.0, 170.0, 160.0], "ack": [45.0]},
    }
    args = argparse.Namespace(rounds=3, requests=2000, slices=6, connections=4)
    lines = pycost.http_table(costs, args).splitlines()
    assert lines[2] == "| request | before µs | after µs | after/before |"
    assert lines[4:] == [
        "| push | 110 | 90 | 0.82 |",
        "| pop | 200 | 160 | 0.80 |",
        "| ack | 90 | 45 | 0.50 |",
        "",
        "- push, each round: before 100, 120, 110; after 90, 80, 100",
        "- pop, each round: before 200, 200, 210; after 150, 170, 160",
        "- ack, each round: before 90; after 45",
    ]


def test_one_tree_is_a_table_without_ratios() -> None:
    costs = {"this": {"push": [10.0], "pop": [20.0], "ack": [30.0]}}
    args = argparse.Namespace(rounds=1, requests=10, slices=1, connections=1)
    assert pycost.http_table(costs, args).splitlines()[2:7] == [
        "| request | this µs |",
        "|---|---:|",
        "| push | 10 |",
        "| pop | 20 |",
        "| ack | 30 |",
    ]
