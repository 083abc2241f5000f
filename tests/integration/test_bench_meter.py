"""The PostgreSQL-bound phase's meter: tuples read per table, index fetches apart from
sequential reads (a scan reads every live row; a probe one)."""

from __future__ import annotations

import psycopg

from bench import pgquota


def test_tuples_read_by_table_keep_index_fetches_apart_from_sequential_reads(db_dsn: str):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id integer PRIMARY KEY)")
        conn.execute("INSERT INTO public.t SELECT generate_series(1, 50)")
        conn.execute("SET enable_indexscan = off")
        conn.execute("SET enable_bitmapscan = off")
        conn.execute("SELECT count(*) FROM public.t").fetchone()  # a scan: 50 rows
        conn.execute("RESET enable_indexscan")
        conn.execute("SET enable_seqscan = off")
        conn.execute("SELECT * FROM public.t WHERE id = 7").fetchone()  # a probe: one
    with psycopg.connect(db_dsn) as conn:  # (the first session's counts, flushed as it ended)
        read = dict(conn.execute(pgquota.BY_TABLE).fetchall())
    assert read["public.t seq"] == 50
    assert read["public.t"] == 1
