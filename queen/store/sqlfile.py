"""Load named SQL statements from a file of `-- name: description --` sections."""

from __future__ import annotations

import re
from pathlib import Path

_MARKER = re.compile(r"^-- (?P<name>[a-z_][a-z0-9_]*):[^\n]*--\s*$", re.MULTILINE)
# Every statement load_queries read, by its text: the name a statement is counted under
# (queen.store.db).
_NAMES: dict[str, str] = {}


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
    queries = parse_queries(path.read_text(encoding="utf-8"))
    _NAMES.update({statement: name for name, statement in queries.items()})
    return queries


def query_name(statement: object) -> str:
    """The name a loaded statement was read under; "other" for any other statement."""
    return _NAMES.get(statement, "other") if isinstance(statement, str) else "other"
