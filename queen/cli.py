"""`queen serve | migrate | maintenance | env`."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import subprocess
import sys
import time

from queen import tokens_cli
from queen.client.cli import add_client_commands
from queen.config import SettingError, Settings, check_exposure, env_table

log = logging.getLogger("queen")

STOP_TIMEOUT = 15.0  # seconds children get to stop before they are killed
# Both run from the installed package, whatever the current folder.
GUNICORN_CONFIG = "python:queen.gunicorn_conf"
MAINTENANCE_MODULE = "queen.workers.maintenance"


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

    settings = Settings.from_env(host=args.host, port=args.port, workers=args.workers)
    check_exposure(settings)
    env = _database_env(settings)
    env.update(HOST=settings.host, PORT=str(settings.port), QUEEN_WORKERS=str(settings.workers))
    dsn = env.get("DATABASE_URL") or settings.dsn
    applied = migrate(dsn)
    log.info("migrations applied: %s", applied or "none pending")

    children: list[subprocess.Popen[bytes]] = []
    if args.maintenance:
        children.append(subprocess.Popen([sys.executable, "-m", MAINTENANCE_MODULE], env=env))
    children.append(
        subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", GUNICORN_CONFIG], env=env)
    )
    url = browser_url(settings.host, settings.port)
    everywhere = settings.host in ("", "0.0.0.0", "::")
    log.info(
        "serving on %s (dashboard %s/dashboard) with %d workers%s",
        url,
        url,
        settings.workers,
        f"; listening on every interface ({settings.host or '*'})" if everywhere else "",
    )
    return _supervise(children)


def _supervise(children: list[subprocess.Popen[bytes]]) -> int:
    """Wait for any child to exit or a stop signal; then stop them all."""
    stopping = False

    def stop(sig: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping and all(child.poll() is None for child in children):
        time.sleep(0.2)
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    failed = [c.returncode for c in children if c.returncode not in (0, -signal.SIGTERM)]
    return 0 if stopping or not failed else 1


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
    serve.add_argument("--host", help="listen address (env HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (env PORT, default 6632)")
    serve.add_argument(
        "--workers", type=int, help="gunicorn workers (env QUEEN_WORKERS, default 2)"
    )
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
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "info").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.extra = extra
    if extra and args.func is not cmd_maintenance:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from queen.embedded import EmbeddedError
    from queen.store.migrate import MigrationsNotFound

    try:
        return int(args.func(args))
    except SettingError as exc:
        parser.exit(2, f"queen: {exc}\n")
    except (MigrationsNotFound, EmbeddedError) as exc:
        parser.exit(1, f"queen: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
