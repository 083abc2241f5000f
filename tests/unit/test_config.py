"""Settings from the environment: parsing, refusals, the DSN and the documented table."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

from queen.config import Settings, env_table

FIELDS = dataclasses.fields(Settings)


def test_defaults_without_environment() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert s.port == 6632
    assert s.db_pool_size == 10
    assert s.default_timeout_ms == 30000
    assert s.max_timeout_ms == 60000
    assert s.max_batch == 1000
    assert not s.database_configured


def test_every_field_is_read_from_its_variable() -> None:
    samples = {int: "7", float: "0.25", str: "text"}

    def sample(f: dataclasses.Field[object]) -> str:
        choices = f.metadata["choices"]
        return choices[0] if choices else samples[type(f.default)]

    env = {f.metadata["env"]: sample(f) for f in FIELDS}
    s = Settings.from_env(env)
    for f in FIELDS:
        expected = type(f.default)(sample(f))
        assert getattr(s, f.name) == expected, f.name


def test_every_field_has_a_distinct_variable_and_a_doc() -> None:
    names = [f.metadata["env"] for f in FIELDS]
    assert len(names) == len(set(names))
    assert all(f.metadata["doc"] for f in FIELDS)


def test_empty_variable_means_default() -> None:
    assert Settings.from_env({"PORT": "", "DB_POOL_SIZE": ""}) == Settings()


def test_parsing_types() -> None:
    s = Settings.from_env(
        {"PORT": "8080", "QUEEN_POLL_FALLBACK": "0.5", "WORKER_ID": "w-1", "DB_POOL_SIZE": "50"}
    )
    assert (s.port, s.poll_fallback_s, s.worker_id, s.db_pool_size) == (8080, 0.5, "w-1", 50)
    assert isinstance(s.port, int)
    assert isinstance(s.poll_fallback_s, float)


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("PORT", "abc"),
        ("PORT", "80.5"),
        ("DB_POOL_SIZE", "ten"),
        ("QUEEN_WORKERS", "2x"),
        ("QUEEN_POLL_FALLBACK", "soon"),
        ("MAX_BATCH_SIZE", "1e3"),
    ],
)
def test_bad_values_raise_naming_the_variable(var: str, value: str) -> None:
    with pytest.raises(ValueError, match=var):
        Settings.from_env({var: value})


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("DB_POOL_SIZE", "0"),
        ("QUEEN_WORKERS", "0"),
        ("PORT", "0"),
        ("PORT", "70000"),
        ("PG_PORT", "-1"),
        ("MAX_BATCH_SIZE", "0"),
        ("QUEEN_POLL_FALLBACK", "0"),
        ("QUEEN_MAINTENANCE_INTERVAL", "-1"),
        ("METRICS_RETENTION_DAYS", "0"),
        ("DEFAULT_TIMEOUT", "-5"),
    ],
)
def test_out_of_range_values_raise_naming_the_variable(var: str, value: str) -> None:
    with pytest.raises(ValueError, match=var):
        Settings.from_env({var: value})


def test_range_edges_are_accepted_and_overrides_are_checked() -> None:
    s = Settings.from_env({"DB_POOL_SIZE": "1", "PORT": "65535", "DEFAULT_TIMEOUT": "0"})
    assert (s.db_pool_size, s.port, s.default_timeout_ms) == (1, 65535, 0)
    with pytest.raises(ValueError, match="QUEEN_WORKERS"):
        Settings.from_env({}, workers=0)


def test_overrides_win_and_none_is_ignored() -> None:
    s = Settings.from_env({"PORT": "1000", "HOST": "10.0.0.1"}, port=2000, host=None)
    assert s.port == 2000
    assert s.host == "10.0.0.1"


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().port = 1  # type: ignore[misc]


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_BATCH_SIZE", "123")
    assert Settings.from_env().max_batch == 123


# -- the connection string ---------------------------------------------------------


def test_database_url_wins() -> None:
    url = "postgresql://u:p@db.example:6543/queen?sslmode=require"
    s = Settings.from_env({"DATABASE_URL": url, "PG_HOST": "other"})
    assert s.dsn == url
    assert s.database_configured


def test_dsn_from_pg_variables() -> None:
    s = Settings.from_env(
        {"PG_HOST": "db", "PG_PORT": "6000", "PG_USER": "queen", "PG_DB": "q", "PG_PASSWORD": "pw"}
    )
    assert s.database_configured
    assert psycopg.conninfo.conninfo_to_dict(s.dsn) == {
        "host": "db",
        "port": "6000",
        "user": "queen",
        "dbname": "q",
        "password": "pw",
    }


def test_dsn_defaults_to_local_postgres_without_password() -> None:
    parsed = psycopg.conninfo.conninfo_to_dict(Settings.from_env({}).dsn)
    assert parsed == {"host": "127.0.0.1", "port": "5432", "user": "postgres", "dbname": "postgres"}


@pytest.mark.parametrize(
    "password", ["it's", "back\\slash", "with space", "a'b\\'c", "=;x", "' host=evil"]
)
def test_dsn_quotes_awkward_values(password: str) -> None:
    s = Settings.from_env({"PG_HOST": "db", "PG_PASSWORD": password, "PG_DB": "my db"})
    parsed = psycopg.conninfo.conninfo_to_dict(s.dsn)
    assert parsed["password"] == password
    assert parsed["dbname"] == "my db"
    assert parsed["host"] == "db"


def test_worker_id() -> None:
    assert Settings(worker_id="w7").effective_worker_id == "w7"
    generated = Settings().effective_worker_id
    assert generated and "-" in generated


# -- documentation -----------------------------------------------------------------


def test_env_table_lists_every_field() -> None:
    table = env_table()
    lines = table.splitlines()
    assert lines[0].startswith("| variable")
    rows = lines[2:]
    assert len(rows) == len(FIELDS)
    for f, row in zip(FIELDS, rows, strict=True):
        assert f"`{f.metadata['env']}`" in row
        assert f"`{f.default}`" in row
        assert f.metadata["doc"] in row


def test_readme_lists_every_setting_as_queen_env_prints_it():
    from pathlib import Path

    from queen.config import env_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert env_table() in readme


def test_cli_reports_a_bad_setting_without_a_traceback(monkeypatch, capsys) -> None:
    from queen import cli

    monkeypatch.setenv("DB_POOL_SIZE", "0")
    with pytest.raises(SystemExit) as exited:
        cli.main(["migrate"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "queen: DB_POOL_SIZE=0 is too small (at least 1)\n"


def test_serve_flags_come_from_the_settings_they_override() -> None:
    from queen.cli import SERVE_FLAGS, build_parser

    fields = {f.name: f for f in dataclasses.fields(Settings)}
    parser = build_parser()
    args = parser.parse_args(["serve", "--host", "0.0.0.0", "--port", "7000", "--workers", "3"])
    assert (args.host, args.port, args.workers) == ("0.0.0.0", 7000, 3)
    assert Settings.from_env({}, **{n: getattr(args, n) for n in SERVE_FLAGS}).port == 7000
    unset = parser.parse_args(["serve"])
    assert Settings.from_env({"PORT": "7001"}, **{n: getattr(unset, n) for n in SERVE_FLAGS}).port == 7001
    serve_help = next(
        a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith("serve")
    ).format_help()
    for name in SERVE_FLAGS:
        assert fields[name].metadata["env"] in serve_help
        assert fields[name].metadata["doc"] in " ".join(serve_help.split())


def test_log_level_is_read_as_settings_read_it() -> None:
    from queen.config import log_level

    assert log_level({}) == Settings().log_level.upper()
    assert log_level({"LOG_LEVEL": "debug", "PORT": "not a port"}) == "DEBUG"
    assert log_level({"LOG_LEVEL": ""}) == "INFO"


def test_serve_hands_the_flags_settings_to_its_children() -> None:
    from queen.cli import SERVE_FLAGS
    from queen.config import as_environ

    settings = Settings.from_env({"QUEEN_WORKERS": "4"}, port=7000)
    assert as_environ(settings, SERVE_FLAGS) == {
        "HOST": "127.0.0.1",
        "PORT": "7000",
        "QUEEN_WORKERS": "4",
    }
    assert Settings.from_env(as_environ(settings, SERVE_FLAGS)) == settings
