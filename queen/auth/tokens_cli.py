"""`queen token create | list | revoke`: the API tokens of QUEEN_AUTH=on."""

from __future__ import annotations

import argparse
import contextlib
import functools
import secrets
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from queen import auth
from queen.config import Settings
from queen.errors import InvalidInput, QueenError

if TYPE_CHECKING:
    from queen.store.tokens import Tokens


@contextlib.contextmanager
def _tokens() -> Iterator[Tokens]:
    """Open the configured database (or the embedded one `queen serve` would start)."""
    from queen.store.db import Database
    from queen.store.tokens import Tokens

    settings = Settings.from_env()
    if settings.database_configured:
        dsn = settings.dsn
    else:
        from queen.embedded import default_data_dir, start_embedded

        dsn = start_embedded(settings.embedded_dir or str(default_data_dir()))
    db = Database(dsn, pool_size=1, application_name="queen-token")
    db.open()
    try:
        yield Tokens(db)
    finally:
        db.close()


def _reporting(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report a refusal (bad name, taken name, no database) in one line, exit status 2."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except QueenError as exc:
            print(f"queen: {exc.message}", file=sys.stderr)
            return 2

    return run


def _rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < rate < float("inf"):
        raise argparse.ArgumentTypeError("must be a positive number of requests per second")
    return rate


@_reporting
def cmd_create(args: argparse.Namespace) -> int:
    role = auth.check_role(args.role)
    name = auth.check_name(args.name or f"{role}-{secrets.token_hex(3)}")
    queues = ",".join(auth.parse_queues(args.queues))
    token = auth.make_token()
    with _tokens() as tokens:
        if not tokens.create(name, auth.token_hash(token), role, queues, args.rate):
            raise InvalidInput(f"a token named {name!r} exists already (revoked ones keep theirs)")
    rate = f"{args.rate:g}/s per worker" if args.rate else "unlimited"
    print(f"token {name}: role {role}, queues {queues}, rate {rate}")
    print("shown once; store it now:")
    print(token)
    return 0


@_reporting
def cmd_list(args: argparse.Namespace) -> int:
    with _tokens() as tokens:
        listed = tokens.list()
    print("name\trole\tqueues\trate\tcreated\tstatus")
    for t in listed:
        status = f"revoked {t.revoked_at:%Y-%m-%d %H:%M:%S}" if t.revoked_at else "active"
        rate = f"{t.rate:g}" if t.rate is not None else "-"
        created = f"{t.created_at:%Y-%m-%d %H:%M:%S}"
        print(f"{t.name}\t{t.role}\t{t.queues}\t{rate}\t{created}\t{status}")
    return 0


@_reporting
def cmd_revoke(args: argparse.Namespace) -> int:
    with _tokens() as tokens:
        if not tokens.revoke(args.name):
            raise InvalidInput(f"no active token named {args.name!r}")
    print(f"revoked {args.name} (every worker refuses it within a second)")
    return 0


def add_parser(sub: Any) -> None:
    """Register `queen token ...` on the CLI's subparsers."""
    token = sub.add_parser("token", help="create, list or revoke API tokens (QUEEN_AUTH=on)")
    actions = token.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a token and print it once")
    create.add_argument("--role", required=True, choices=list(auth.ROLES))
    create.add_argument("--name", help="a name for it (default: role and a random suffix)")
    create.add_argument(
        "--queues",
        metavar="GLOB",
        default=auth.EVERY_QUEUE,
        help="comma-separated queue globs (default: *)",
    )
    create.add_argument(
        "--rate", type=_rate, metavar="N", help="requests per second per worker (default: no limit)"
    )
    create.set_defaults(func=cmd_create)
    actions.add_parser("list", help="list tokens (never their values)").set_defaults(func=cmd_list)
    revoke = actions.add_parser("revoke", help="revoke a token by name")
    revoke.add_argument("name")
    revoke.set_defaults(func=cmd_revoke)
