"""Studies that answer one question each (README.md); the harness imports nothing from here."""

from __future__ import annotations

from pathlib import Path


def save_lines(path: str | Path, lines: list[str]) -> None:
    """Write a study's markdown lines to path and print them."""
    text = "\n".join(lines) + "\n"
    Path(path).write_text(text)
    print(text)
