"""What does a listening session cost PostgreSQL a notification, in commits?

    python -m bench.experiments.listener_commits [--dsn DSN | --cluster] [--notifies 200]
        [--listeners 0,1,2]

Each worker keeps one session listening for wake-ups (queen.events). For each number of
listeners: that many idle sessions LISTEN on a channel of the study's own, one session
sends --notifies NOTIFYs one at a time (a short pause after each, so that each reaches
the listeners on its own, as the server's do under load), and pg_stat_database's commits
of the study's database are read before and after (once every session has reported its
statistics). Reported: commits a NOTIFY. The sender's own are one each; what each
listener adds over that is the transaction PostgreSQL runs in a listening session to
read the notifications it was signalled.
"""

from __future__ import annotations

import argparse
import time

import psycopg

from bench.experiments import add_server_arguments, migrated_database

CHANNEL = "queen_study_listener"
STATS_FLUSH_S = 1.2  # an idle backend reports its statistics within a second


def commits(conn: psycopg.Connection[tuple[int]]) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0]) - 1  # (not counting this one)


def per_notify(dsn: str, listeners: int, notifies: int) -> float:
    """Commits of the database a NOTIFY with that many idle listeners."""
    sessions = [psycopg.connect(dsn, autocommit=True) for _ in range(listeners + 2)]
    try:
        sender, meter, *listening = sessions
        for session in listening:
            session.execute(f"LISTEN {CHANNEL}")
        time.sleep(STATS_FLUSH_S)
        before = commits(meter)
        for n in range(notifies):
            sender.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(n)))
            time.sleep(0.002)
        for session in [sender, *listening]:  # each reports what it counted
            session.execute("SELECT pg_stat_force_next_flush()")
            session.execute("SELECT 1")
        time.sleep(STATS_FLUSH_S)
        return (commits(meter) - before) / notifies
    finally:
        for session in sessions:
            session.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.listener_commits")
    add_server_arguments(parser)
    parser.add_argument("--notifies", type=int, default=200)
    parser.add_argument("--listeners", default="0,1,2", help="comma list of listener counts")
    args = parser.parse_args(argv)
    with migrated_database(args, "queen_study_listener_commits") as (dsn, server):
        print(f"{server}: {args.notifies} NOTIFYs one at a time")
        for listeners in (int(n) for n in args.listeners.split(",")):
            rate = per_notify(dsn, listeners, args.notifies)
            print(f"{listeners} idle listeners: {rate:.2f} commits a NOTIFY", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
