"""`queen serve | migrate | maintenance | env`."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile

from queen import logs
from queen.auth import tokens_cli
from queen.client.cli import add_client_commands
from queen.config import (
    SettingError,
    Settings,
    add_flags,
    as_environ,
    check_exposure,
    env_table,
    log_level,
)
from queen.server.claims import CLAIMS_ENV
from queen.server.status import STATE_ENV
from queen.server.supervisor import Supervisor

log = logging.getLogger("queen")

# Both run from the installed package, whatever the current folder.
GUNICORN_CONFIG = "python:queen.gunicorn_conf"
MAINTENANCE_MODULE = "queen.workers.maintenance"
SERVE_FLAGS = ("host", "port", "workers")  # Settings fields `queen serve` takes as flags
ROLES = {"serve": "supervisor"}  # the role a command logs as (queen.logs), if not its name


def _database_env(settings: Settings) -> dict[str, str]:
    """Return the environment naming the database, starting an embedded one if none is set."""
    env = dict(os.environ)
    if settings.database_configured:
        return env
    from queen.embedded import default_data_dir, is_initialised, setup_log, start_embedded

    data_dir = settings.embedded_dir or str(default_data_dir())
    log.info(
        "no database configured: %s embedded PostgreSQL in %s (its log: %s)",
        "starting" if is_initialised(data_dir) else "creating",
        data_dir,
        setup_log(data_dir),
    )
    env["DATABASE_URL"] = start_embedded(data_dir)
    return env


class PortInUse(Exception):
    """The address `queen serve` was to listen on is taken."""


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUse when host:port cannot be bound, as gunicorn would find out only
    after retrying the bind for half a minute. Bound the way gunicorn binds it
    (SO_REUSEADDR), then released at once."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise PortInUse(
                f"cannot listen on {host}:{port}: {exc.strerror} (another server on port"
                f" {port}? choose one with --port or PORT)"
            ) from exc


def browser_url(host: str, port: int) -> str:
    """Return the URL of a server listening on host:port, as a browser here can open it."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def cmd_migrate(args: argparse.Namespace) -> int:
    from queen.store.migrate import migrate

    settings = Settings.from_env()
    dsn = _database_env(settings).get("DATABASE_URL") or settings.dsn
    applied = migrate(dsn)
    print(f"applied {len(applied)} migration(s): {', '.join(applied) or 'none pending'}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from queen.store.migrate import migrate

    settings = Settings.from_env(**{name: getattr(args, name) for name in SERVE_FLAGS})
    check_exposure(settings)
    check_port_free(settings.host, settings.port)
    env = _database_env(settings)
    env.update(as_environ(settings, SERVE_FLAGS))  # what the flags set reaches the children
    dsn = env.get("DATABASE_URL") or settings.dsn
    applied = migrate(dsn)
    log.info("migrations applied: %s", applied or "none pending")

    children: list[tuple[str, list[str]]] = []
    if args.maintenance:
        children.append(("maintenance", [sys.executable, "-m", MAINTENANCE_MODULE]))
    children.append(("gunicorn", [sys.executable, "-m", "gunicorn", "-c", GUNICORN_CONFIG]))
    state_dir = tempfile.mkdtemp(prefix="queen-serve-")  # the children's states, for /health
    env[STATE_ENV] = os.path.join(state_dir, "children.json")
    # Kept across gunicorn restarts: claims of workers of a master that died are given
    # back by the next one (queen.server.claims).
    env.setdefault(CLAIMS_ENV, os.path.join(state_dir, "claims"))
    # The API serves without maintenance: only gunicorn's crash loop stops the server.
    supervisor = Supervisor(children, env, essential={"gunicorn"}, state_path=env[STATE_ENV])
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    url = browser_url(settings.host, settings.port)
    everywhere = settings.host in ("", "0.0.0.0", "::")
    log.info(
        "serving on %s (dashboard %s/dashboard) with %d workers%s",
        url,
        url,
        settings.workers,
        f"; listening on every interface ({settings.host or '*'})" if everywhere else "",
    )
    try:
        return supervisor.run()
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def cmd_maintenance(args: argparse.Namespace) -> int:
    # Imported by name: setup.cfg maps workers/ to queen.workers, which mypy cannot follow.
    maintenance = importlib.import_module(MAINTENANCE_MODULE)
    return int(maintenance.main(args.extra))


def cmd_env(args: argparse.Namespace) -> int:
    print(env_table())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="queen", description="Queen message queue server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP API (gunicorn) and the maintenance process")
    add_flags(serve, SERVE_FLAGS)
    serve.add_argument(
        "--no-maintenance",
        dest="maintenance",
        action="store_false",
        help="do not start the maintenance process",
    )
    serve.set_defaults(func=cmd_serve)
    sub.add_parser("migrate", help="apply pending migrations").set_defaults(func=cmd_migrate)
    sub.add_parser(  # its flags (and --help) are parsed by queen.workers.maintenance
        "maintenance", help="run the maintenance process", add_help=False
    ).set_defaults(func=cmd_maintenance)
    sub.add_parser("env", help="list the environment variables").set_defaults(func=cmd_env)
    tokens_cli.add_parser(sub)
    add_client_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # (the client verbs set their own, quiet, level and format)
    logs.setup(ROLES.get(args.command, args.command), log_level())
    args.extra = extra
    if extra and args.func is not cmd_maintenance:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from queen.embedded import EmbeddedError
    from queen.store.migrate import EarlierDatabase, MigrationsNotFound

    try:
        return int(args.func(args))
    except SettingError as exc:
        parser.exit(2, f"queen: {exc}\n")
    except (MigrationsNotFound, EarlierDatabase, EmbeddedError, PortInUse) as exc:
        parser.exit(1, f"queen: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
