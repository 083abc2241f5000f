"""The named-query loader and the real queen/store/queries.sql."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from queen.store.sqlfile import load_queries, parse_queries

STORE = Path(__file__).resolve().parents[2] / "queen" / "store"


def test_parse_sections_in_order() -> None:
    text = """-- Header comment, not a query.

-- first: the first query --
SELECT 1

-- second_2: keeps the comments of its body --
-- a comment inside the statement
SELECT a,
       b -- trailing comment
FROM t
WHERE x = %(x)s

-- third: last one, no trailing newline --
UPDATE t SET a = 1"""
    queries = parse_queries(text)
    assert list(queries) == ["first", "second_2", "third"]
    assert queries["first"] == "SELECT 1"
    assert queries["third"] == "UPDATE t SET a = 1"
    assert queries["second_2"].startswith("-- a comment inside")
    assert queries["second_2"].endswith("WHERE x = %(x)s")


def test_marker_needs_the_closing_dashes() -> None:
    queries = parse_queries("-- a: real --\nSELECT 1\n-- b: not a marker\nSELECT 2\n")
    assert list(queries) == ["a"]
    assert "SELECT 2" in queries["a"]


def test_duplicate_names_raise() -> None:
    with pytest.raises(ValueError, match="'a'.*twice"):
        parse_queries("-- a: one --\nSELECT 1\n-- b: two --\nSELECT 2\n-- a: again --\nSELECT 3")


@pytest.mark.parametrize(
    "text",
    [
        "-- a: empty --\n",
        "-- a: empty --\n\n   \n-- b: fine --\nSELECT 1",
        "-- a: fine --\nSELECT 1\n-- b: empty at the end --\n\n",
    ],
)
def test_empty_query_raises(text: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        parse_queries(text)


def test_no_markers_no_queries() -> None:
    assert parse_queries("-- just a comment\n") == {}


def test_load_queries_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "q.sql"
    path.write_text("-- only: the only one --\nSELECT 42\n", encoding="utf-8")
    assert load_queries(path) == {"only": "SELECT 42"}


def test_real_queries_load_and_hold_one_statement_each() -> None:
    queries = load_queries()
    assert queries
    for name, statement in queries.items():
        code = "\n".join(line.split("--")[0] for line in statement.splitlines())
        assert ";" not in code.strip().rstrip(";"), f"{name} holds several statements"


def _names_used_in_store() -> set[str]:
    used: set[str] = set()
    patterns = [  # a name passed to a runner of named queries, or looked up in them
        r"""\.(?:fetch|rows|_rows|_value|_act|_fetch)\(\s*["']([a-z_0-9]+)["']""",
        r"""(?:QUERIES|queries)\[\s*["']([a-z_0-9]+)["']\s*\]""",
    ]
    for path in STORE.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pattern in patterns:
            used.update(re.findall(pattern, text))
    return used


def test_every_query_named_in_the_store_exists() -> None:
    queries = load_queries()
    used = _names_used_in_store()
    assert {"push", "ack", "ping", "configure_queue"} <= used  # the scan finds names
    assert used - set(queries) == set()


def test_every_query_is_used_by_the_store() -> None:
    assert set(load_queries()) - _names_used_in_store() == set()
