"""Queues as a file says: `queen configure --file` and `queen apply`.

A queues file (YAML, or JSON, which YAML reads too)::

    queues:
      orders:
        namespace: shop            # optional
        task: fulfil               # optional
        options: {leaseTime: 60, retryLimit: 5}
        consumerGroups:
          billing: {subscriptionMode: all}     # or: new, or subscriptionFrom: <time>
          audit: {}

`apply` compares it with the server, prints the changes, then makes them: queues created
or configured, groups subscribed. What the file leaves out is left as it is, so applying
the same file again changes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from queen.client.cli_output import OK, BadInput, show
from queen.client.errors import NotFound
from queen.client.sync import Queen

# The queue options the server takes (API.md section 4), by their API name.
OPTION_TYPES: dict[str, type] = {
    "leaseTime": int,
    "retryLimit": int,
    "retryDelay": int,  # milliseconds
    "priority": int,
    "maxSize": int,
    "ttl": int,
    "dlqAfterMaxRetries": bool,
    "delayedProcessing": int,
    "windowBuffer": int,
    "retentionSeconds": int,
    "completedRetentionSeconds": int,
    "retentionEnabled": bool,
    "encryptionEnabled": bool,
    "maxWaitTimeSeconds": int,
}


def snake(name: str) -> str:
    """leaseTime -> lease_time."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


# `queen configure`'s flag (argparse dest) of each option: leaseTime -> --lease-time.
OPTION_FLAGS = {name: snake(name) for name in OPTION_TYPES}
SUBSCRIPTION_KEYS = ("subscriptionMode", "subscriptionFrom")


class FileError(Exception):
    """A queues file the command cannot use."""


@dataclasses.dataclass(frozen=True)
class QueueSpec:
    """What a file (or flags) say of one queue; None and absent keys: leave as it is."""

    name: str
    namespace: str | None = None
    task: str | None = None
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    groups: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    def merged(self, namespace: str | None, task: str | None, options: dict[str, Any]) -> QueueSpec:
        """This spec with the given values over its own (flags over a file)."""
        return dataclasses.replace(
            self,
            namespace=namespace if namespace is not None else self.namespace,
            task=task if task is not None else self.task,
            options={**self.options, **options},
        )

    def snake_options(self) -> dict[str, Any]:
        """The options as the SDK's configure() takes them (lease_time=60)."""
        return {OPTION_FLAGS[name]: value for name, value in self.options.items()}


@dataclasses.dataclass(frozen=True)
class Change:
    """One difference between the file and the server, and how to describe it."""

    queue: str
    kind: str  # "queue": create or configure the queue; "group": subscribe a group
    text: str
    group: str | None = None


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    """Add --lease-time, --retry-limit, ... (one per option) to parser."""
    for name, kind in OPTION_TYPES.items():
        dest = OPTION_FLAGS[name]
        flag = "--" + dest.replace("_", "-")
        if kind is bool:
            parser.add_argument(flag, dest=dest, type=_boolean, metavar="true|false")
        else:
            parser.add_argument(flag, dest=dest, type=int, metavar="N", help=f"option {name}")


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "yes", "on", "1"):
        return True
    if text.lower() in ("false", "no", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _load(path: str) -> Any:
    import yaml  # type: ignore[import-untyped]

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FileError(f"{path} is not YAML: {exc}") from None


def _options(where: str, doc: Any) -> dict[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise FileError(f"{where}: options must be a mapping")
    for name, value in doc.items():
        kind = OPTION_TYPES.get(name)
        if kind is None:
            known = ", ".join(OPTION_TYPES)
            raise FileError(f"{where}: unknown option {name!r} (known: {known})")
        if type(value) is not kind:
            raise FileError(
                f"{where}: {name} must be {'true or false' if kind is bool else 'an integer'}"
            )
    return dict(doc)


def _label(where: str, doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise FileError(f"{where}: {key} must be a string")
    return value


def _groups(where: str, doc: Any) -> dict[str, dict[str, str]]:
    if doc is None:
        return {}
    if isinstance(doc, list):
        doc = {name: {} for name in doc}
    if not isinstance(doc, dict):
        raise FileError(f"{where}: consumerGroups must be a mapping or a list of names")
    groups: dict[str, dict[str, str]] = {}
    for name, spec in doc.items():
        spec = spec or {}
        if not isinstance(spec, dict) or set(spec) - set(SUBSCRIPTION_KEYS):
            raise FileError(f"{where}: group {name!r} takes subscriptionMode or subscriptionFrom")
        groups[str(name)] = {k: str(v) for k, v in spec.items()}
    return groups


def _queue_spec(name: str, doc: Any, where: str) -> QueueSpec:
    doc = doc or {}
    if not isinstance(doc, dict):
        raise FileError(f"{where}: must be a mapping")
    unknown = set(doc) - {"namespace", "task", "options", "consumerGroups"}
    if unknown:
        raise FileError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    return QueueSpec(
        name,
        _label(where, doc, "namespace"),
        _label(where, doc, "task"),
        _options(f"{where}.options", doc.get("options")),
        _groups(f"{where}.consumerGroups", doc.get("consumerGroups")),
    )


def read_queue_options(path: str, queue: str) -> QueueSpec:
    """Read `queen configure --file`: a queue's options, or {namespace, task, options}."""
    doc = _load(path)
    if not isinstance(doc, dict):
        raise FileError(f"{path}: must be a mapping")
    if "options" in doc or "namespace" in doc or "task" in doc:
        return _queue_spec(queue, doc, path)
    return QueueSpec(queue, options=_options(path, doc))


def read_queues_file(path: str) -> list[QueueSpec]:
    """Read `queen apply`'s file: {queues: {name: spec}}."""
    doc = _load(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("queues"), dict):
        raise FileError(f"{path}: must have a mapping `queues:` of queue names")
    return [_queue_spec(str(name), spec, f"queues.{name}") for name, spec in doc["queues"].items()]


def plan(queen: Queen, wanted: list[QueueSpec]) -> list[Change]:
    """The changes that make the server hold what wanted says."""
    changes: list[Change] = []
    for spec in wanted:
        try:
            current = queen.queue(spec.name)
        except NotFound:
            changes.append(Change(spec.name, "queue", f"+ queue {spec.name}{_labels(spec)}"))
            changes += [
                Change(spec.name, "queue", f"    {name}: {json.dumps(value)}")
                for name, value in spec.options.items()
            ]
            groups: set[str] = set()
        else:
            changes += _queue_changes(spec, current)
            groups = {g["name"] for g in queen.consumer_groups(spec.name)}
        for group, subscription in spec.groups.items():
            if group not in groups:
                start = " ".join(f"{k}={v}" for k, v in subscription.items()) or "from all"
                text = f"+ consumer group {group} on {spec.name} ({start})"
                changes.append(Change(spec.name, "group", text, group))
    return changes


def _labels(spec: QueueSpec) -> str:
    labels = [f"{k} {v}" for k, v in (("namespace", spec.namespace), ("task", spec.task)) if v]
    return f" ({', '.join(labels)})" if labels else ""


def _queue_changes(spec: QueueSpec, current: dict[str, Any]) -> list[Change]:
    changes = []
    for key in ("namespace", "task"):
        value = getattr(spec, key)
        if value is not None and value != current.get(key):
            text = f"~ {spec.name} {key}: {json.dumps(current.get(key))} -> {json.dumps(value)}"
            changes.append(Change(spec.name, "queue", text))
    for name, value in spec.options.items():
        now = current["options"].get(name)
        if now != value:
            text = f"~ {spec.name} {name}: {json.dumps(now)} -> {json.dumps(value)}"
            changes.append(Change(spec.name, "queue", text))
    return changes


def carry_out(queen: Queen, changes: list[Change], wanted: list[QueueSpec]) -> None:
    """Make the changes: each queue configured once, then its new groups subscribed."""
    by_name = {spec.name: spec for spec in wanted}
    for name in dict.fromkeys(c.queue for c in changes if c.kind == "queue"):
        spec = by_name[name]
        queen.configure(name, spec.namespace, spec.task, **spec.snake_options())
    for change in changes:
        if change.kind == "group" and change.group is not None:
            start = by_name[change.queue].groups[change.group]
            subscription = start.get("subscriptionMode") or start.get("subscriptionFrom")
            queen.subscribe(change.group, change.queue, subscription)


def cmd_configure(queen: Queen, args: argparse.Namespace) -> int:
    spec = QueueSpec(args.queue)
    if args.file:
        spec = read_queue_options(args.file, args.queue)
    flags = {name: value for name, value in vars(args).items() if value is not None}
    spec = spec.merged(
        namespace=flags.get("namespace"),
        task=flags.get("task"),
        options={o: flags[dest] for o, dest in OPTION_FLAGS.items() if dest in flags},
    )
    if not spec.options and spec.namespace is None and spec.task is None:
        raise BadInput("nothing to configure (give option flags or --file)")
    options = queen.configure(spec.name, spec.namespace, spec.task, **spec.snake_options())
    show(
        args,
        [{"option": k, "value": v} for k, v in options.items()],
        [("OPTION", lambda r: r["option"]), ("VALUE", lambda r: json.dumps(r["value"]))],
    )
    return OK


def cmd_apply(queen: Queen, args: argparse.Namespace) -> int:
    wanted = read_queues_file(args.file)
    changes = plan(queen, wanted)
    for change in changes:
        print(change.text)
    if not changes:
        print("nothing to change")
        return OK
    if args.dry_run:
        return OK
    carry_out(queen, changes, wanted)
    print(f"applied {len(changes)} change(s)")
    return OK
