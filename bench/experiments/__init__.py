"""Studies that answer one question each (README.md); the harness imports nothing from here."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from bench import cluster
from bench.systems import drop_database, fresh_database
from queen.store.migrate import migrate


def save_lines(path: str | Path, lines: list[str]) -> None:
    """Write a study's markdown lines to path and print them."""
    text = "\n".join(lines) + "\n"
    Path(path).write_text(text)
    print(text)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """--dsn and --cluster: the server migrated_database makes its database on."""
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    cluster.add_argument(parser)


@contextlib.contextmanager
def migrated_database(args: argparse.Namespace, name: str) -> Iterator[tuple[str, str]]:
    """A fresh database `name` migrated by `queen migrate`'s code, on the server of
    args.dsn (or, with args.cluster, on a throwaway cluster), dropped at the end; yields
    its DSN and a line describing the server."""
    with contextlib.ExitStack() as stack:
        server = cluster.server_dsn(args.dsn, args.cluster, stack)
        dsn = fresh_database(server, name)
        try:
            migrate(dsn)
            yield dsn, cluster.describe(server, args.cluster)
        finally:
            drop_database(server, name)
