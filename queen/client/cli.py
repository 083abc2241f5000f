"""`queen push | pop | tail | stats | queues | dlq | groups | configure | apply`: the client
for people.

Exit codes: 0 ok (also when stopped by Ctrl-C or SIGTERM), 1 bad input (usage, JSON, any
other 4xx), 2 server unreachable or 5xx, 4 nothing to pop. Quiet but for warnings and
errors; -v logs each request, -vv the transport's details.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from queen.client import queues_file
from queen.client.cli_output import (
    BAD_INPUT,
    NOTHING,
    OK,
    UNREACHABLE,
    BadInput,
    Column,
    emit_json,
    show,
)
from queen.client.errors import APIError, NotFound, QueenError, ServerError, TransportError
from queen.client.models import Message
from queen.client.sync import Queen
from queen.client.transport import DEFAULT_URL, RetryPolicy

Command = Callable[[Queen, argparse.Namespace], int]


COUNTS: list[Column] = [
    ("PENDING", lambda r: r["pending"]),
    ("PROCESSING", lambda r: r["processing"]),
    ("COMPLETED", lambda r: r["completed"]),
    ("FAILED", lambda r: r["failed"]),
    ("DEAD", lambda r: r["deadLetter"]),
    ("TOTAL", lambda r: r["total"]),
]


# --- commands -------------------------------------------------------------------------
def payloads(args: argparse.Namespace) -> Iterator[Any]:
    """The JSON arguments, or NDJSON lines from stdin when there are none."""
    lines = args.json if args.json else sys.stdin
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError as exc:
            where = f"argument {n}" if args.json else f"stdin line {n}"
            raise BadInput(f"{where} is not JSON: {exc}") from None


def cmd_push(queen: Queen, args: argparse.Namespace) -> int:
    data = list(payloads(args))
    if not data:
        raise BadInput("nothing to push (give JSON arguments or NDJSON on stdin)")
    results = []
    for start in range(0, len(data), args.batch):
        results += queen.push(args.queue, data[start : start + args.batch], args.partition)
    rows = [{"transactionId": r.transaction_id, "id": r.id, "status": r.status} for r in results]
    show(
        args,
        rows,
        [("TRANSACTION ID", lambda r: r["transactionId"]), ("STATUS", lambda r: r["status"])],
    )
    return OK


def message_columns() -> list[Column]:
    return [
        ("TRANSACTION ID", lambda r: r["transactionId"]),
        ("PARTITION", lambda r: r["partition"]),
        ("RETRIES", lambda r: r["retryCount"]),
        ("DATA", lambda r: json.dumps(r.get("data", r.get("payload")))),
    ]


def warn_if_unknown(queen: Queen, queue: str) -> None:
    """Say on stderr when queue does not exist (a pop of it answers nothing, as an empty
    one does)."""
    try:
        queen.queue(queue)
    except NotFound:
        print(f"queen: queue {queue!r} does not exist (is its name right?)", file=sys.stderr)
    except QueenError:
        pass  # a token that may not read it: nothing to say


def cmd_pop(queen: Queen, args: argparse.Namespace) -> int:
    messages = queen.pop(
        args.queue,
        args.partition,
        batch=args.n,
        wait=args.wait > 0,
        timeout=args.wait,
        group=args.group,
    )
    if not messages:
        print("nothing to pop", file=sys.stderr)
        warn_if_unknown(queen, args.queue)
        return NOTHING
    if args.ack:
        queen.ack_many(messages)
    show(args, [m.as_json() for m in messages], message_columns())
    return OK


def tail_doc(m: dict[str, Any]) -> dict[str, Any]:
    """One message as tail prints it, read or popped: the same fields either way."""
    return {
        "transactionId": m["transactionId"],
        "queue": m["queue"],
        "partition": m["partition"],
        "data": m["data"] if "data" in m else m.get("payload"),
        "createdAt": m["createdAt"],
        "retryCount": m["retryCount"],
    }


def cmd_tail(queen: Queen, args: argparse.Namespace) -> int:
    if args.group:
        return _tail_group(queen, args)
    seen: set[str] = set()
    warned = False
    while True:
        try:
            latest = queen.messages(args.queue, limit=args.n)
        except NotFound:
            if not args.follow:
                raise
            if not warned:  # following: the queue may yet be made
                warn_if_unknown(queen, args.queue)
                warned = True
            latest = []
        fresh = [m for m in reversed(latest) if m["transactionId"] not in seen]
        seen.update(m["transactionId"] for m in fresh)
        emit_json(tail_doc(m) for m in fresh)
        if not args.follow:
            return OK
        time.sleep(args.interval)


def _tail_group(queen: Queen, args: argparse.Namespace) -> int:
    """Read the queue as a consumer group: pop, print, ack (other groups are untouched)."""
    warned = False
    while True:
        messages: list[Message] = queen.pop(
            args.queue, batch=args.n, wait=args.follow, timeout=args.interval * 10, group=args.group
        )
        if messages:
            emit_json(tail_doc(m.as_json()) for m in messages)
            queen.ack_many(messages)
            continue
        if not warned:
            warn_if_unknown(queen, args.queue)
            warned = True
        if not args.follow:
            return OK


def cmd_stats(queen: Queen, args: argparse.Namespace) -> int:
    if args.queue:
        doc = queen.stats(args.queue)
        rows = [{"name": p["name"], **p["stats"]} for p in doc["partitions"]]
        rows.append({"name": "(all)", **doc["totals"]})
        show(args, rows, [("PARTITION", lambda r: r["name"]), *COUNTS])
    else:
        rows = [{"name": q["queue"], **q["totals"]} for q in queen.stats()]
        show(args, rows, [("QUEUE", lambda r: r["name"]), *COUNTS])
    return OK


def cmd_queues(queen: Queen, args: argparse.Namespace) -> int:
    rows = [
        {"name": q["name"], "partitions": q["partitions"], **q["messages"]} for q in queen.queues()
    ]
    show(
        args,
        rows,
        [("QUEUE", lambda r: r["name"]), ("PARTITIONS", lambda r: r["partitions"]), *COUNTS],
    )
    return OK


def cmd_dlq_list(queen: Queen, args: argparse.Namespace) -> int:
    rows = queen.dead_letters(args.queue, args.n)
    show(
        args,
        rows,
        [
            *message_columns()[:3],
            ("FAILED AT", lambda r: r["failedAt"]),
            ("ERROR", lambda r: r["errorMessage"]),
        ],
    )
    return OK


def cmd_dlq_retry(queen: Queen, args: argparse.Namespace) -> int:
    if args.transaction_ids:
        for txid in args.transaction_ids:
            queen.retry_message(txid)
        retried = list(args.transaction_ids)
    else:
        retried = queen.retry_dead_letters(args.queue, args.n)
    show(
        args,
        [{"transactionId": t, "retried": True} for t in retried],
        [("TRANSACTION ID", lambda r: r["transactionId"]), ("RETRIED", lambda r: "yes")],
    )
    return OK


def cmd_groups_list(queen: Queen, args: argparse.Namespace) -> int:
    rows = queen.consumer_groups()
    show(
        args,
        rows,
        [
            ("GROUP", lambda r: r["name"]),
            ("QUEUE", lambda r: r["queue"]),
            ("PARTITIONS", lambda r: r.get("partitions")),
            ("PENDING", lambda r: r.get("pending")),
            ("LAG (S)", lambda r: r.get("lagSeconds")),
        ],
    )
    return OK


def cmd_groups_seek(queen: Queen, args: argparse.Namespace) -> int:
    doc = queen.seek(args.group, args.queue, args.to)
    show(
        args,
        [doc if isinstance(doc, dict) else {"result": doc}],
        [
            ("GROUP", lambda r: args.group),
            ("QUEUE", lambda r: args.queue),
            ("TO", lambda r: args.to),
        ],
    )
    return OK


def cmd_groups_delete(queen: Queen, args: argparse.Namespace) -> int:
    doc = queen.delete_consumer_group(args.group, args.queue)
    rows = [{"group": doc["consumerGroup"], **d} for d in doc["deleted"]]
    show(
        args,
        rows,
        [
            ("GROUP", lambda r: r["group"]),
            ("QUEUE", lambda r: r["queue"]),
            ("PARTITIONS", lambda r: r["partitions"]),
        ],
    )
    return OK


# --- wiring ---------------------------------------------------------------------------
def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # (a BaseException: no retry loop or handler swallows it)


def stop_on_signals() -> None:
    """End on SIGTERM and SIGINT, also when the parent ignored SIGINT (a script's
    background job), where Python would leave Ctrl-C ignored."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)


def quiet_logging(verbosity: int) -> None:
    """Warnings and errors only; -v: each request too (httpx's INFO lines); -vv: all."""
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbosity, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", force=True)


def run(command: Command, args: argparse.Namespace) -> int:
    """Run a command with a client; turn errors into exit codes."""
    quiet_logging(args.verbose)
    stop_on_signals()
    try:
        # A person at a terminal would rather hear at once that nothing answers.
        with Queen(args.url, token=args.token, retry=RetryPolicy(patience=0)) as queen:
            return command(queen, args)
    except (BadInput, queues_file.FileError) as exc:
        print(f"queen: {exc}", file=sys.stderr)
        return BAD_INPUT
    except (TransportError, ServerError) as exc:
        print(f"queen: {exc.message}", file=sys.stderr)
        return UNREACHABLE
    except APIError as exc:
        print(f"queen: {exc.message} (HTTP {exc.status})", file=sys.stderr)
        return BAD_INPUT
    except QueenError as exc:
        print(f"queen: {exc.message}", file=sys.stderr)
        return UNREACHABLE
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM
        return OK
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (| head): nothing left to say
        return OK


class Parser(argparse.ArgumentParser):
    """Usage errors exit 1, as other bad input does (argparse's own default: 2)."""

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        self.exit(BAD_INPUT, f"{self.prog}: error: {message}\n")


class IntermixedParser(Parser):
    """Options may come between positionals: `queen push orders --partition eu '{}' '{}'`."""

    _mixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._mixing:  # parse_known_intermixed_args calls back here
            return super().parse_known_args(args, namespace)
        self._mixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False


def _common(output: str) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=os.environ.get("QUEEN_URL") or DEFAULT_URL,
        help=f"server base URL(s), comma-separated (env QUEEN_URL, default {DEFAULT_URL})",
    )
    common.add_argument(
        "--token", default=os.environ.get("QUEEN_TOKEN"), help="bearer token (env QUEEN_TOKEN)"
    )
    common.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default=output,
        help=f"output format (default {output}; json: one document per line)",
    )
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log each request (-vv: the transport's details too)",
    )
    return common


def _add(sub: Any, name: str, command: Command, output: str, help: str) -> Any:
    parser = sub.add_parser(name, help=help, description=help, parents=[_common(output)])
    parser.set_defaults(func=lambda args: run(command, args))
    parser.__class__ = IntermixedParser  # made by the `queen` parser's own class
    return parser


def _group(sub: Any, name: str, help: str) -> Any:
    """A verb of verbs (`queen dlq list`); its own usage errors exit 1 too."""
    parser = sub.add_parser(name, help=help, description=help)
    parser.__class__ = Parser
    return parser.add_subparsers(dest=f"{name}_command", required=True)


def add_client_commands(sub: Any) -> None:
    """Add the client verbs to the `queen` command's subparsers."""
    p = _add(sub, "push", cmd_push, "json", "push JSON payloads (arguments, or NDJSON on stdin)")
    p.add_argument("queue")
    p.add_argument("json", nargs="*", metavar="JSON", help="one payload each")
    p.add_argument("--partition", help="partition (default: Default)")
    p.add_argument("--batch", type=int, default=500, help="payloads per request (default 500)")

    p = _add(sub, "pop", cmd_pop, "json", "lease messages and print them (exit 4: none)")
    p.add_argument("queue")
    p.add_argument("-n", type=int, default=1, help="at most this many (default 1)")
    p.add_argument("--partition")
    p.add_argument("--group", help="consumer group")
    p.add_argument("--wait", type=float, default=0.0, help="long-poll seconds (default 0)")
    p.add_argument("--ack", action="store_true", help="acknowledge them as completed")

    p = _add(
        sub,
        "tail",
        cmd_tail,
        "json",
        "print a queue's latest messages as NDJSON (with --group: consume them as that group)",
    )
    p.add_argument("queue")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new messages")
    p.add_argument("-n", type=int, default=10, help="messages per read (default 10)")
    p.add_argument("--group", help="read as this consumer group (pop and ack)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reads")

    p = _add(sub, "stats", cmd_stats, "table", "message counts per queue, or per partition")
    p.add_argument("queue", nargs="?")
    _add(sub, "queues", cmd_queues, "table", "list queues")

    dlq = _group(sub, "dlq", "dead letters: list | retry")
    p = _add(dlq, "list", cmd_dlq_list, "table", "list a queue's dead letters")
    p.add_argument("queue")
    p.add_argument("-n", type=int, default=100, help="at most this many (default 100)")
    p = _add(dlq, "retry", cmd_dlq_retry, "table", "make dead letters pending again")
    p.add_argument("queue")
    p.add_argument(
        "transaction_ids",
        nargs="*",
        metavar="TRANSACTION_ID",
        help="these only (default: every dead letter of the queue, up to -n)",
    )
    p.add_argument("-n", type=int, default=1000)

    groups = _group(sub, "groups", "consumer groups: list | seek | delete")
    _add(groups, "list", cmd_groups_list, "table", "list consumer groups")
    p = _add(groups, "seek", cmd_groups_seek, "table", "move a group's position in a queue")
    p.add_argument("group")
    p.add_argument("queue")
    p.add_argument("--to", required=True, help="beginning | end | an ISO-8601 time")
    p = _add(groups, "delete", cmd_groups_delete, "table", "forget a group (it starts over)")
    p.add_argument("group")
    p.add_argument("--queue", help="on this queue only (default: every queue it reads)")

    p = _add(
        sub,
        "configure",
        queues_file.cmd_configure,
        "table",
        "set a queue's options (flags or --file)",
    )
    p.add_argument("queue")
    p.add_argument("-f", "--file", help="YAML or JSON: the options (and namespace, task)")
    p.add_argument("--namespace")
    p.add_argument("--task")
    queues_file.add_option_flags(p)

    p = _add(
        sub,
        "apply",
        queues_file.cmd_apply,
        "table",
        "make queues, their options and consumer groups as a YAML file says (diff first)",
    )
    p.add_argument("file", help="YAML (or JSON) file: see docs/CLIENT.md")
    p.add_argument("--dry-run", action="store_true", help="show the changes, make none")
