"""A progress bar (tqdm when installed, one line per step otherwise)."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.enabled = enabled
        self.done = 0
        self._bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, unit="case", dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                self._bar = None

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(text)
        elif self.enabled:
            print(f"[{self.done + 1}/{self.total}] {text}", file=sys.stderr, flush=True)

    def advance(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
