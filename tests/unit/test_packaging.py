"""What an installed Queen carries: setup.cfg's packages and package data against the tree."""

from __future__ import annotations

import configparser
import glob
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from queen import cli
from queen.store import migrate as migrate_module
from queen.store.migrate import MigrationsNotFound, migrate, migration_files, sql_dir

ROOT = Path(__file__).resolve().parents[2]


def _options() -> configparser.SectionProxy:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config["options"]


def _lines(value: str) -> list[str]:
    return [item.strip() for line in value.splitlines() for item in line.split(",") if item.strip()]


def _packages() -> list[str]:
    return _lines(_options()["packages"])


def _source_dir(package: str) -> Path:
    """The folder setup.cfg takes package from (its package_dir mapping, else its path)."""
    mapping = dict(
        (part.strip() for part in line.split("=", 1)) for line in _lines(_options()["package_dir"])
    )
    return ROOT / mapping.get(package, package.replace(".", "/"))


def _package_data() -> dict[str, list[str]]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return {name: _lines(value) for name, value in config["options.package_data"].items()}


def _tree_packages() -> set[str]:
    """Packages of the source tree by their installed names (workers/ is queen.workers)."""
    found: set[str] = set()
    for top, prefix in (("queen", ("queen",)), ("workers", ("queen", "workers"))):
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(".".join(prefix + init.parent.relative_to(ROOT / top).parts))
    return found


def test_every_package_of_the_tree_is_listed_and_all_live_under_queen() -> None:
    listed = set(_packages())
    assert all(name == "queen" or name.startswith("queen.") for name in listed)
    missing = _tree_packages() - listed
    assert not missing, f"packages missing from setup.cfg: {sorted(missing)}"
    assert all(_source_dir(name).is_dir() for name in listed)


def _carried() -> set[Path]:
    """Every file a package_data glob of setup.cfg picks up."""
    return {
        Path(hit)
        for name, patterns in _package_data().items()
        for pattern in patterns
        for hit in glob.glob(str(_source_dir(name) / pattern), recursive=True)
        if Path(hit).is_file()
    }


def test_package_data_carries_every_file_that_is_not_python() -> None:
    files = {
        path
        for name in _packages()
        for path in _source_dir(name).rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    missing = sorted(str(p.relative_to(ROOT)) for p in files - _carried())
    assert not missing, f"files no package_data glob carries: {missing}"


def test_every_file_under_sql_is_carried() -> None:
    sql_files = [p for p in (ROOT / "sql").rglob("*") if p.is_file()]
    assert sql_files
    assert _source_dir("queen._sql") == ROOT / "sql"
    assert set(sql_files) <= _carried()
    # A function file in a new subfolder is carried too.
    assert any(pattern.startswith("**/") for pattern in _package_data()["queen._sql"])


def test_sql_dir_in_a_checkout_is_the_sql_folder() -> None:
    assert sql_dir() == ROOT / "sql"
    assert [p.name for p in migration_files()] == sorted(
        p.name for p in (ROOT / "sql" / "migrations").glob("*.sql")
    )


def test_migrate_without_migration_files_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(MigrationsNotFound, match="no migration files") as raised:
        migrate("postgresql://nobody@127.0.0.1:1/none", directory=tmp_path)  # never connects
    assert str(tmp_path) in str(raised.value)


def test_cli_migrate_without_migration_files_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    monkeypatch.setattr(migrate_module, "sql_dir", lambda: tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli.main(["migrate"])
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        f"queen: no migration files (NNNN_*.sql) in {tmp_path / 'migrations'}\n"
    )


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:6632"),
        ("", "http://127.0.0.1:6632"),
        ("127.0.0.1", "http://127.0.0.1:6632"),
        ("::", "http://[::1]:6632"),
        ("10.1.2.3", "http://10.1.2.3:6632"),
        ("queen.example", "http://queen.example:6632"),
    ],
)
def test_serve_logs_a_url_a_browser_can_open(host: str, url: str) -> None:
    assert cli.browser_url(host, 6632) == url


@pytest.mark.slow
def test_the_wheel_holds_queen_alone_with_every_sql_and_worker_file(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=600,
    )
    (wheel,) = tmp_path.glob("queen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/", 1)[0] for n in names} == {"queen", "queen-0.1.0.dist-info"}
    for path in (ROOT / "sql").rglob("*.sql"):
        assert f"queen/_sql/{path.relative_to(ROOT / 'sql').as_posix()}" in names
    for path in (ROOT / "workers").glob("*.py"):
        assert f"queen/workers/{path.name}" in names
    assert "queen/gunicorn_conf.py" in names
