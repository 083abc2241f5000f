"""`python -m bench.profile --nested`: the profiled database counts the statements that
functions run (pg_stat_statements.track = all) in its sessions from then on."""

from __future__ import annotations

import psycopg

from bench import profile


def test_nested_sets_the_tracking_of_the_databases_next_sessions(db_dsn: str, server_dsn: str):
    name = psycopg.conninfo.conninfo_to_dict(db_dsn)["dbname"]
    profile.track_nested(server_dsn, str(name))
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT current_setting('pg_stat_statements.track')").fetchone() == (
            "all",
        )
