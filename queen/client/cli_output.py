"""What the CLI's verbs share: exit codes, bad input, tables and NDJSON."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

OK, BAD_INPUT, UNREACHABLE, NOTHING = 0, 1, 2, 4
Column = tuple[str, Callable[[dict[str, Any]], Any]]


class BadInput(Exception):
    """Input the command cannot use."""


# --- output ---------------------------------------------------------------------------
def emit_json(docs: Iterable[Any]) -> None:
    """One JSON document per line (NDJSON), flushed as it goes (for pipes and -f)."""
    for doc in docs:
        sys.stdout.write(json.dumps(doc, separators=(",", ":"), default=str) + "\n")
        sys.stdout.flush()


def table(rows: list[dict[str, Any]], columns: list[Column]) -> str:
    """Rows as aligned text columns under a header."""
    cells = [[header for header, _ in columns]]
    cells += [["" if (v := get(row)) is None else str(v) for _, get in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def show(args: argparse.Namespace, rows: list[dict[str, Any]], columns: list[Column]) -> None:
    if args.output == "json":
        emit_json(rows)
    else:
        print(table(rows, columns))
