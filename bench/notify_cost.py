"""What NOTIFY costs a push: throughput with the wake-up notifications and without them.

    python -m bench.notify_cost [--clients 4] [--seconds 5] [--rounds 3] [--no-http] [--cluster]

Side by side in one run, on the cursor store (on $QUEEN_BENCH_DSN's server, or with
--cluster on a throwaway cluster with default settings). Each level uses one fresh
database (and one Queen), and the
variants are switched in place between rounds (the notification functions replaced by
no-ops or restored, the list of waiting workers filled or emptied), rotating the order,
so that table growth and background noise hit every variant alike.

SQL level (--clients processes calling queen.push_rows directly):
  in-push       a plain session: the push NOTIFYs inside its transaction (queen.wake).
  after-commit  what Queen's sessions do: queen.push_notify = after_commit, then
                queen.notify_pushed in a transaction of its own (one per push here),
                with a worker listed as having polls parked, so it does notify.
  none          no notification at all (notify functions replaced by no-ops).
HTTP level (--clients processes pushing through Queen, 2 gunicorn workers):
  queen         Queen as shipped with polls parked somewhere (a worker listed): every
                push sends its wake-ups, after commit, shared by concurrent pushes.
  queen-idle    Queen as shipped, nobody waiting: pushes skip their wake-ups.
  queen-silent  notify functions replaced by no-ops (the baseline).

Batch 100 spreads over 10 partitions (10 notifications per push); batch 1 rotates over
100 partitions. At SQL level a listener drains the notifications, as Queen's workers
would (over HTTP they do). Goal: with / without >= 0.9. Writes bench/results/notify-cost.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable

import psycopg
import requests

from bench import cluster
from bench.report import save_lines
from bench.systems import BENCH_DIR, QueenServer, drop_database, fresh_database

SERVER_DSN = os.environ.get("QUEEN_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
SILENT = """
CREATE OR REPLACE FUNCTION queen.wake(p_partitions uuid[]) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN END $$;
CREATE OR REPLACE FUNCTION queen.notify_wakes(p_payloads text[]) RETURNS void
LANGUAGE plpgsql AS $$ BEGIN END $$;
CREATE OR REPLACE FUNCTION queen.notify_pushed(p_queues text[], p_partitions text[])
RETURNS void LANGUAGE plpgsql AS $$ BEGIN END $$;
"""
DEFER = "SELECT set_config('queen.push_notify', 'after_commit', false)"
SQL_VARIANTS = ("in-push", "after-commit", "none")
HTTP_VARIANTS = ("queen", "queen-idle", "queen-silent")


def make_database(server_dsn: str, name: str) -> str:
    """A fresh database at the current schema (through the migrations, as Queen expects)."""
    from queen.store.migrate import migrate

    dsn = fresh_database(server_dsn, name)
    migrate(dsn)
    return dsn


def real_functions(dsn: str) -> str:
    """The definitions of the notify functions as the schema has them (to restore them)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'queen'"
            " AND p.proname IN ('wake', 'notify_wakes', 'notify_pushed')"
        ).fetchall()
    return ";\n".join(r[0] for r in rows) + ";"


def switch(dsn: str, real: str, notify: bool, listed: bool) -> None:
    """Make the notify functions real or no-ops, and list a waiting worker or none."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(real if notify else SILENT)  # type: ignore[arg-type]
        conn.execute("DELETE FROM queen.waiting_workers")
        if listed:  # as if a worker had polls parked for the whole round
            conn.execute("SELECT queen.list_waiting_worker('bench', 86400)")


SETUPS = {  # variant: (notify functions real, a waiting worker listed)
    "in-push": (True, True),
    "after-commit": (True, True),
    "none": (False, False),
    "queen": (True, True),
    "queen-idle": (True, False),
    "queen-silent": (False, False),
}


def batch_items(client: int, batch: int, i: int) -> list[dict[str, object]]:
    spread = 10 if batch > 1 else 100
    return [
        {"queue": f"c{client}", "partition": f"p{(i + k) % spread}", "payload": {"k": k}}
        for k in range(batch)
    ]


def sql_pusher(
    dsn: str, variant: str, client: int, batch: int, seconds: float, out: multiprocessing.Queue
) -> None:
    """Call queen.push_rows for `seconds` the way `variant` says; put the messages stored."""
    stored = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        if variant != "in-push":
            conn.execute(DEFER)
        started = time.monotonic()
        deadline = started + seconds
        i = 0
        while time.monotonic() < deadline:
            items = batch_items(client, batch, i)
            i += 1
            row = conn.execute(
                "SELECT count(*) FROM queen.push_rows(%s::jsonb, NULL)", (json.dumps(items),)
            ).fetchone()
            stored += row[0] if row else 0
            if variant == "after-commit":
                pairs = sorted({(str(it["queue"]), str(it["partition"])) for it in items})
                conn.execute(
                    "SELECT queen.notify_pushed(%s, %s)",
                    ([q for q, _ in pairs], [p for _, p in pairs]),
                )
    out.put((stored, time.monotonic() - started))


def http_pusher(
    url: str, variant: str, client: int, batch: int, seconds: float, out: multiprocessing.Queue
) -> None:
    """POST /push for `seconds`; put the messages stored."""
    stored = 0
    with requests.Session() as session:
        started = time.monotonic()
        deadline = started + seconds
        i = 0
        while time.monotonic() < deadline:
            response = session.post(
                f"{url}/api/v1/push", json={"items": batch_items(client, batch, i)}, timeout=30
            )
            i += 1
            assert response.status_code == 201, response.text
            stored += batch
    out.put((stored, time.monotonic() - started))


def measure(
    target: Callable[..., None], where: str, variant: str, clients: int, batch: int, seconds: float
) -> float:
    # spawn, not fork: this process runs threads (listeners, a parked poll), and a child
    # forked while one of them holds a lock can hang for good.
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    procs = [
        context.Process(target=target, args=(where, variant, c, batch, seconds, out))
        for c in range(clients)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return sum(stored / took for stored, took in results)  # each child times its own run


class Drain(threading.Thread):
    """A LISTEN connection that reads every notification, as a Queen worker does."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute("LISTEN queen")
        self.received = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            for _ in self.conn.notifies(timeout=0.5):
                self.received += 1


def run_rounds(
    variants: tuple[str, ...],
    run: Callable[[str, int], float],
    rounds: int,
    rates: dict[tuple[int, str], list[float]],
) -> None:
    for batch in (100, 1):
        for rnd in range(rounds):
            order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
            for variant in order:
                rate = run(variant, batch)
                rates.setdefault((batch, variant), []).append(rate)
                print(
                    f"batch {batch:>3} round {rnd + 1} {variant:>12}: {rate:,.0f} msg/s", flush=True
                )


def table(
    rates: dict[tuple[int, str], list[float]], variants: tuple[str, ...], baseline: str
) -> list[str]:
    head = " | ".join(f"{v} (msg/s)" for v in variants)
    ratios = " | ".join(f"{v} / {baseline}" for v in variants if v != baseline)
    lines = [f"| batch | {head} | {ratios} | goal |", "|---" * (len(variants) * 2 + 1) + "|"]
    for batch in (100, 1):
        medians = {v: statistics.median(rates[(batch, v)]) for v in variants}
        cells = " | ".join(f"{medians[v]:,.0f}" for v in variants)
        quotients = " | ".join(
            f"{medians[v] / medians[baseline]:.2f}" for v in variants if v != baseline
        )
        lines.append(f"| {batch} | {cells} | {quotients} | ≥ 0.9 |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP-level part")
    parser.add_argument("--out", default=str(BENCH_DIR / "results" / "notify-cost.md"))
    cluster.add_argument(parser)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        run(args, cluster.server_dsn(SERVER_DSN, args.cluster, stack))


def run(args: argparse.Namespace, server_dsn: str) -> None:
    postgres = cluster.describe(server_dsn, args.cluster)

    names = {"sql": "queen_bench_notify_sql", "http": "queen_bench_notify_http"}
    levels = ("sql",) if args.no_http else ("sql", "http")
    dsns = {level: make_database(server_dsn, names[level]) for level in levels}
    real = real_functions(dsns["sql"])
    drains = [Drain(dsns["sql"])]  # over HTTP, Queen's own listeners drain them
    for drain in drains:
        drain.start()
    server: QueenServer | None = None
    sql_rates: dict[tuple[int, str], list[float]] = {}
    http_rates: dict[tuple[int, str], list[float]] = {}

    def sql_round(variant: str, batch: int) -> float:
        switch(dsns["sql"], real, *SETUPS[variant])
        return measure(sql_pusher, dsns["sql"], variant, args.clients, batch, args.seconds)

    def http_round(variant: str, batch: int) -> float:
        assert server is not None
        switch(dsns["http"], real, *SETUPS[variant])
        return measure(http_pusher, server.url, variant, args.clients, batch, args.seconds)

    try:
        print("SQL level", flush=True)
        run_rounds(SQL_VARIANTS, sql_round, args.rounds, sql_rates)
        if "http" in dsns:
            server = QueenServer(dsns["http"], workers=2, maintenance=False).start()
            print("HTTP level", flush=True)
            run_rounds(HTTP_VARIANTS, http_round, args.rounds, http_rates)
    finally:
        if server is not None:
            server.stop()
        for drain in drains:
            drain.running = False
        time.sleep(0.6)
        for level in levels:
            drop_database(server_dsn, names[level])

    lines = [
        "# NOTIFY cost on push",
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, `python -m bench.notify_cost"
        f" --clients {args.clients} --seconds {args.seconds} --rounds {args.rounds}`;"
        f" {platform.node()}, {os.cpu_count()} CPUs, load average"
        f" {os.getloadavg()[0]:.1f} at the end; {postgres}, synchronous commit on;"
        " the cursor store. Medians of"
        f" {args.rounds} rounds of {args.seconds} s, {args.clients} concurrent clients.",
        "",
        "## SQL level (queen.push_rows called directly)",
        "",
        *table(sql_rates, SQL_VARIANTS, "none"),
        "",
    ]
    if http_rates:
        lines += [
            "## HTTP level (POST /api/v1/push through Queen, 2 workers)",
            "",
            *table(http_rates, HTTP_VARIANTS, "queen-silent"),
            "",
        ]
    lines.append(
        "Every round: "
        + "; ".join(
            f"{v} b{b}: " + " ".join(f"{r:,.0f}" for r in rs)
            for (b, v), rs in sorted({**sql_rates, **http_rates}.items())
        )
    )
    save_lines(args.out, lines)


if __name__ == "__main__":
    main()
