"""Settings: one frozen object read from the environment, each field with its variable and doc."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from queen.fusion import FUSED_CALLS


class SettingError(ValueError):
    """A setting's environment variable holds a value Queen cannot use."""


def _s(
    env: str,
    default: Any,
    doc: str,
    least: float | None = None,
    most: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """Declare a setting: its environment variable, default, help text and allowed values."""
    return dataclasses.field(
        default=default,
        metadata={"env": env, "doc": doc, "least": least, "most": most, "choices": choices},
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every runtime setting of a Queen process."""

    database_url: str = _s(
        "DATABASE_URL", "", "PostgreSQL URL; when empty, PG_* variables or an embedded server"
    )
    pg_host: str = _s("PG_HOST", "", "PostgreSQL host (used when DATABASE_URL is empty)")
    pg_port: int = _s("PG_PORT", 5432, "PostgreSQL port", least=1, most=65535)
    pg_user: str = _s("PG_USER", "postgres", "PostgreSQL user")
    pg_password: str = _s("PG_PASSWORD", "", "PostgreSQL password")
    pg_db: str = _s("PG_DB", "postgres", "PostgreSQL database")
    db_pool_size: int = _s("DB_POOL_SIZE", 10, "connections per gunicorn worker", least=1)
    db_timeout_ms: int = _s(
        "DB_TIMEOUT", 5000, "ms to wait for a pooled connection before answering 503", least=1
    )
    statement_timeout_ms: int = _s(
        "QUEEN_STATEMENT_TIMEOUT",
        30000,
        "statement_timeout of admin actions off the hot path (ms)",
        least=0,
    )
    hot_path_timeout_ms: int = _s(
        "QUEEN_HOT_PATH_TIMEOUT",
        5000,
        "statement_timeout of push, pop, ack, lease and transaction calls (ms); past it"
        " plus 2 s the call's connection is cut and the request answers 503",
        least=0,
    )
    host: str = _s("HOST", "127.0.0.1", "address to listen on")
    port: int = _s("PORT", 6632, "port to listen on", least=1, most=65535)
    workers: int = _s("QUEEN_WORKERS", 2, "gunicorn worker processes", least=1)
    worker_connections: int = _s(
        "QUEEN_WORKER_CONNECTIONS", 10000, "concurrent requests (long polls) per worker", least=1
    )
    idle_timeout_s: float = _s(
        "QUEEN_IDLE_TIMEOUT",
        75.0,
        "seconds a keep-alive connection may wait for its next request",
        least=0.01,
    )
    header_timeout_s: float = _s(
        "QUEEN_HEADER_TIMEOUT", 10.0, "seconds a request's headers may take to arrive", least=0.01
    )
    worker_id: str = _s("WORKER_ID", "", "name recorded on leased messages (default: hostname-pid)")
    default_timeout_ms: int = _s("DEFAULT_TIMEOUT", 30000, "long-poll timeout (ms)", least=0)
    max_timeout_ms: int = _s("MAX_TIMEOUT", 60000, "largest long-poll timeout (ms)", least=0)
    poll_fallback_s: float = _s(
        "QUEEN_POLL_FALLBACK", 2.0, "seconds between fallback re-checks of parked polls", least=0.01
    )
    max_batch: int = _s("MAX_BATCH_SIZE", 1000, "largest push or pop batch", least=1)
    fused_calls: int = _s(
        "QUEEN_FUSED_CALLS",
        FUSED_CALLS,
        "push, pop, ack or lease calls of each kind a worker runs at once; requests arriving"
        " meanwhile share the next call (0: no fusion); with 1, a host's workers take turns"
        " (QUEEN_FUSION_TURNS)",
        least=0,
    )
    fusion_turns: str = _s(
        "QUEEN_FUSION_TURNS",
        "auto",
        "how a host's workers take turns at database calls: auto (calls of any kind, the"
        " host's share of QUEEN_DB_CALLS at once), kind (one call of each kind at a time),"
        " host (one call at a time), off (each worker alone)",
        choices=("auto", "kind", "host", "off"),
    )
    db_calls: int = _s(
        "QUEEN_DB_CALLS",
        2,
        "fused calls of any kind the database is given at once (QUEEN_FUSION_TURNS=auto),"
        " split among the servers sharing it, at least one each",
        least=1,
    )
    encryption_key: str = _s(
        "QUEEN_ENCRYPTION_KEY", "", "64 hex chars (AES-256) for encryptionEnabled queues"
    )
    embedded_dir: str = _s("QUEEN_EMBEDDED_DIR", "", "data directory of the embedded PostgreSQL")
    maintenance_interval_s: float = _s(
        "QUEEN_MAINTENANCE_INTERVAL", 1.0, "seconds between maintenance cycles", least=0.01
    )
    retention_interval_s: float = _s(
        "QUEEN_RETENTION_INTERVAL",
        5.0,
        "seconds between retention and partition cleanup runs",
        least=0.01,
    )
    leader_poll_s: float = _s(
        "QUEEN_LEADER_POLL",
        1.0,
        "seconds between a standby maintenance process's leader attempts",
        least=0.01,
    )
    maintenance_batch: int = _s(
        "QUEEN_MAINTENANCE_BATCH", 1000, "rows (or leases) per maintenance statement", least=1
    )
    metrics_interval_s: float = _s(
        "METRICS_COLLECTION_INTERVAL", 5.0, "seconds between depth snapshots", least=0.01
    )
    metrics_retention_days: int = _s(
        "METRICS_RETENTION_DAYS", 30, "days of per-minute metrics kept", least=1
    )
    partition_cleanup_s: int = _s(
        "QUEEN_PARTITION_CLEANUP", 86400, "empty partitions are removed after this (s)", least=0
    )
    dashboard_depth_interval_s: float = _s(
        "QUEEN_DASHBOARD_DEPTH_INTERVAL",
        5.0,
        "seconds between queue.depth dashboard events",
        least=0.01,
    )
    dashboard_stats_interval_s: float = _s(
        "QUEEN_DASHBOARD_STATS_INTERVAL",
        10.0,
        "seconds between system.stats dashboard events",
        least=0.01,
    )
    dashboard_client_buffer: int = _s(
        "QUEEN_DASHBOARD_CLIENT_BUFFER",
        1000,
        "events queued per dashboard before the oldest drop",
        least=1,
    )
    dashboard_flush_interval_s: float = _s(
        "QUEEN_DASHBOARD_FLUSH_INTERVAL",
        1.0,
        "seconds between a worker's batches of dashboard events (one NOTIFY each)",
        least=0.05,
    )
    dashboard_max_events_per_s: int = _s(
        "QUEEN_DASHBOARD_MAX_EVENTS",
        1000,
        "per-message dashboard events per second per worker",
        least=0,
    )
    log_level: str = _s("LOG_LEVEL", "info", "log level")
    auth: str = _s(
        "QUEEN_AUTH",
        "",
        "on: every API request needs a token; off: open (unset: off, loopback HOST only)",
        choices=("on", "off"),
    )
    metrics_auth: str = _s(
        "QUEEN_METRICS_AUTH",
        "off",
        "on: /metrics/prometheus needs a token too (with QUEEN_AUTH=on)",
        choices=("on", "off"),
    )
    cors_origins: str = _s(
        "QUEEN_CORS_ORIGINS", "*", "origins browsers may call from: * or a comma-separated list"
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Build settings from environment variables, then apply non-None overrides."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = environ.get(field.metadata["env"], "")
            if raw != "":
                values[field.name] = _parse(field, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        for field in dataclasses.fields(cls):
            if field.name in values:
                _check_range(field, values[field.name])
        return cls(**values)

    @property
    def auth_on(self) -> bool:
        """Tell whether requests need a token (QUEEN_AUTH=on)."""
        return self.auth == "on"

    @property
    def database_configured(self) -> bool:
        """Tell whether a database was named (otherwise `queen serve` embeds one)."""
        return bool(self.database_url or self.pg_host)

    @property
    def dsn(self) -> str:
        """Return the libpq connection string for the configured database."""
        if self.database_url:
            return self.database_url
        parts = {
            "host": self.pg_host or "127.0.0.1",
            "port": str(self.pg_port),
            "user": self.pg_user,
            "dbname": self.pg_db,
        }
        if self.pg_password:
            parts["password"] = self.pg_password
        return " ".join(f"{k}='{_quote(v)}'" for k, v in parts.items())

    @property
    def effective_worker_id(self) -> str:
        """Return the worker id recorded on leases."""
        return self.worker_id or f"{socket.gethostname()}-{os.getpid()}"


def add_flags(parser: argparse.ArgumentParser, names: Iterable[str]) -> None:
    """Add a command-line flag for each named setting: --name (a trailing _s dropped,
    dashes for underscores), of its default's type, with its help text, variable and
    default. A flag left out is None, so Settings.from_env(**vars(args)) keeps the
    environment's value."""
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    for name in names:
        field = fields[name]
        env = field.metadata["env"]
        parser.add_argument(
            "--" + name.removesuffix("_s").replace("_", "-"),
            dest=name,
            type=type(field.default),
            metavar=env,
            help=f"{field.metadata['doc']} (env {env}, default {field.default})",
        )


def as_environ(settings: Settings, names: Iterable[str]) -> dict[str, str]:
    """Return the environment variables that give another process these named settings."""
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    return {fields[name].metadata["env"]: str(getattr(settings, name)) for name in names}


def log_level(environ: Mapping[str, str] | None = None) -> str:
    """LOG_LEVEL as Settings reads it, in the form logging takes (upper case). Read on
    its own, so that a process can log why another setting is refused."""
    environ = os.environ if environ is None else environ
    field = next(f for f in dataclasses.fields(Settings) if f.name == "log_level")
    raw = environ.get(field.metadata["env"], "")
    return str(_parse(field, raw) if raw else field.default).upper()


def _parse(field: dataclasses.Field[Any], raw: str) -> Any:
    choices = field.metadata["choices"]
    if choices is not None:
        if raw.lower() not in choices:
            env = field.metadata["env"]
            raise SettingError(f"{env}={raw!r} must be one of {', '.join(choices)}")
        return raw.lower()
    kind: type[Any] = type(field.default)
    try:
        return kind(raw)
    except ValueError as exc:
        env = field.metadata["env"]
        raise SettingError(f"{env}={raw!r} is not a valid {kind.__name__}") from exc


def _check_range(field: dataclasses.Field[Any], value: Any) -> None:
    """Refuse a value outside the setting's range, naming its variable."""
    least, most = field.metadata["least"], field.metadata["most"]
    env = field.metadata["env"]
    choices = field.metadata["choices"]
    if choices is not None and value != field.default and value not in choices:
        raise SettingError(f"{env}={value!r} must be one of {', '.join(choices)}")
    if least is not None and value < least:
        raise SettingError(f"{env}={value!r} is too small (at least {least})")
    if most is not None and value > most:
        raise SettingError(f"{env}={value!r} is too large (at most {most})")


def is_loopback(host: str) -> bool:
    """Tell whether a listen address only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def check_exposure(settings: Settings) -> None:
    """Refuse to serve an open API beyond this machine unless QUEEN_AUTH=off says so.

    Queen's protected mode: with QUEEN_AUTH unset, only a loopback HOST is allowed.
    """
    if settings.auth == "" and not is_loopback(settings.host):
        raise SettingError(
            f"refusing to listen on {settings.host} without authentication: set QUEEN_AUTH=on"
            " (tokens: `queen token create`), or QUEEN_AUTH=off to serve it open anyway,"
            " or HOST=127.0.0.1"
        )


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def env_table() -> str:
    """Render the settings as a markdown table (README and `queen env`)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for field in dataclasses.fields(Settings):
        meta = field.metadata
        rows.append(f"| `{meta['env']}` | `{field.default}` | {meta['doc']} |")
    return "\n".join(rows)
