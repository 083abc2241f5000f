"""Load named SQL statements from a file of `-- name: description --` sections."""

from __future__ import annotations

import re
from pathlib import Path

_MARKER = re.compile(r"^-- (?P<name>[a-z_][a-z0-9_]*):[^\n]*--\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split text into {name: statement}; each section starts with a marker line."""
    queries: dict[str, str] = {}
    matches = list(_MARKER.finditer(text))
    for match, following in zip(matches, [*matches[1:], None][: len(matches)], strict=True):
        end = following.start() if following else len(text)
        name = match.group("name")
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        body = text[match.end() : end].strip()
        if not body:
            raise ValueError(f"query {name!r} is empty")
        queries[name] = body
    return queries


def load_queries(path: Path | None = None) -> dict[str, str]:
    """Read queen/store/queries.sql (or path) into {name: statement}."""
    path = path or Path(__file__).with_name("queries.sql")
    return parse_queries(path.read_text(encoding="utf-8"))
