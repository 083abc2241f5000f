"""The long-poll wake-up protocol: what PostgreSQL notifies and how the server reads it.

PostgreSQL notifies on CHANNEL when a partition may have work for a consumer. The payload
is 'queue/partition/namespace/task' (namespace and task empty when the queue has none),
made by queen.wake_payload in sql/functions/wakeups.sql; a partition that one consumer
group's ack or give-back freed concerns that group alone, and its payload names the group
after the route ('queue/partition/namespace/task/group'). Names cannot contain '/'.
tests/integration/test_wakeups.py pins payload() and parse() here to the SQL functions.

Parked polls are indexed by route key: (BY_PARTITION, queue, partition),
(BY_QUEUE, queue, None) or (BY_FILTER, namespace, task), None matching anything.

A push that names no partition goes to DEFAULT_PARTITION (queen.default_partition in
SQL). No column has it as a default: every insert names its partition. The name is also
written out, as prose, in the API description (queen/api/openapi.json) and in the help
of `queen push --partition` (queen.client, which imports nothing of the server).
"""

from __future__ import annotations

import dataclasses

from queen.models import PopRoute

CHANNEL = "queen"  # queen.wake_channel()
DEFAULT_PARTITION = "Default"  # queen.default_partition()

BY_PARTITION = "p"
BY_QUEUE = "q"
BY_FILTER = "f"

RouteKey = tuple[str, str | None, str | None]


@dataclasses.dataclass(frozen=True, slots=True)
class Wake:
    """A notification read back: the partition it names and, for one group's, the group."""

    queue: str
    partition: str
    namespace: str | None = None
    task: str | None = None
    group: str | None = None  # None: for every group (a push's)


def payload(
    queue: str,
    partition: str,
    namespace: str | None = None,
    task: str | None = None,
    group: str | None = None,
) -> str:
    """The payload queen.wake_payload makes of these names."""
    route = f"{queue}/{partition}/{namespace or ''}/{task or ''}"
    return route if group is None else f"{route}/{group}"


def parse(text: str) -> Wake:
    """Read a payload back (missing fields are empty, as in a payload cut short)."""
    queue, partition, namespace, task, *rest = [*text.split("/", 4), "", "", "", ""][:5]
    return Wake(queue, partition, namespace or None, task or None, rest[0] or None)


def route_key(route: PopRoute) -> RouteKey:
    """Index a parked poll by what it asks for."""
    if route.kind == "partition":
        return (BY_PARTITION, route.queue, route.partition)
    if route.kind == "queue":
        return (BY_QUEUE, route.queue, None)
    return (BY_FILTER, route.namespace, route.task)


def keys_for(wake: Wake) -> tuple[RouteKey, ...]:
    """The route keys a notification can serve."""
    ns, task = wake.namespace, wake.task
    return (
        (BY_PARTITION, wake.queue, wake.partition),
        (BY_QUEUE, wake.queue, None),
        (BY_FILTER, None, None),
        (BY_FILTER, ns, None),
        (BY_FILTER, None, task),
        (BY_FILTER, ns, task),
    )
