"""The API's hot path: push, pop, ack; concurrent requests of a kind share one database call.

Over the functions of sql/functions/ (push, pop, ack); the model is in docs/STORAGE.md.
Requests that arrive while FUSED_CALLS calls of their kind are in flight wait for the
next one, which takes them all (queen.fusion): one statement and one commit for many
requests, each answered its own results in its own order. A request that finds a free
slot goes at once, alone.
Message ids in answers are UUIDs derived from the bigint id and created_at
(queen.message_uuid), made the same way here (message_uuid).

A pop names its lease id itself. When the database connection breaks during a pop, the
pop may have committed and its answer be lost: GiveBacks gives that lease back in the
background without counting an attempt (queen.give_back_claim), instead of
letting it expire into a retry.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import orjson
import psycopg
from psycopg import Cursor
from psycopg.rows import RowMaker

from queen import crypto
from queen.errors import InvalidInput, QueenError
from queen.fusion import FUSED_CALLS, Fuser, Observe, Trace, split, untraced
from queen.models import AckResult, Popped, PopRoute, PushResult
from queen.server.claims import NOWHERE, InFlight
from queen.server.turns import NO_TURNS, Turns
from queen.store.db import LARGE_CALL_BYTES, Backend, Database, text_array
from queen.store.giveback import GiveBacks
from queen.store.lifecycle import QUEUE_MODE
from queen.store.polling import Wakeups
from queen.store.queues import Queues
from queen.wakeup import DEFAULT_PARTITION

AfterExecute = Callable[[psycopg.Connection[Any]], None]

POPPED_COLUMNS = list(Popped._fields)
FUSED_PUSH_BYTES = 1024 * 1024  # a fused push call takes request bodies up to this in all
FUSED_POPS = 32  # pops per fused call
FUSED_ACKS = 1000  # acknowledgments per fused call


class _Push(NamedTuple):
    body: str  # the request's JSON body, {"items": [...]}
    items: list[dict[str, Any]]


class _Pop(NamedTuple):
    params: dict[str, Any]  # one element of queen.pop_rows's array
    lease: uuid.UUID


# Row factories for the hot paths. psycopg calls the row maker they return once per row;
# tuple.__new__ builds a NamedTuple record in C, where NamedTuple._make runs Python code
# and psycopg's class_row also builds a dict of column names per row. tuple.__new__ does
# not count the values, so the factories check the columns, once per query.
# (They read the result's own column count and names: cursor.description builds a Column
# object per column, which costs more than the rows of a small pop.)
def _push_rows(cursor: Cursor[Any]) -> RowMaker[Sequence[Any]]:
    """Check the columns of push: a PushResult's fields in order, then a compact answer's
    ids (_push_results); its rows as they come."""
    result = cursor.pgresult
    width = result.nfields if result is not None else 0
    if width != len(PushResult._fields) + 1:
        raise TypeError(f"push answered {width} columns")
    return lambda values: values


def _push_results(rows: list[Sequence[Any]]) -> list[PushResult]:
    """The results of a push call, one an item: a PushResult of each row, or the items'
    made from a compact answer (one row of position 0: the API ids' prefix, the made
    transactionIds' prefix, then the messages' ids in item order: made_txids)."""
    make = functools.partial(tuple.__new__, PushResult)
    if len(rows) != 1 or rows[0][0] != 0:
        return [make(row[:-1]) for row in rows]
    prefix, made, ids = rows[0][1], rows[0][2], rows[0][-1]
    txids = made_txids([made], ids)
    return [
        make((k, f"{prefix}{message_id:012x}", txid, "queued"))
        for k, (message_id, txid) in enumerate(zip(ids, txids, strict=True), 1)
    ]


def push_new_params(
    params: dict[str, Any], items: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[int]]:
    """The parameters of push_new for items naming no transactionId (params: bodies and
    producer, items: the bodies' in order), and each item's slot: its partition's 1-based
    position among the call's distinct (queue, partition) pairs."""
    pairs: dict[tuple[str, str], int] = {}
    slots = [
        pairs.setdefault((i["queue"], i.get("partition") or DEFAULT_PARTITION), len(pairs) + 1)
        for i in items
    ]
    return {
        **params,
        "queues": text_array([queue for queue, _ in pairs]),
        "partitions": text_array([partition for _, partition in pairs]),
        "slots": "{" + ",".join(map(str, slots)) + "}",
    }, slots


def made_txids(prefixes: list[str], ids: list[int]) -> list[str]:
    """The transactionIds made of messages' ids, as queen.made_txid makes them: prefixes
    (queen.made_prefix of their partitions) one for all, or one an id."""
    if len(prefixes) == 1:
        prefixes = prefixes * len(ids)
    return [
        f"{p}{0x8000 | (i >> 48) & 0x3FFF:04x}-{i & 0xFFFFFFFFFFFF:012x}"
        for p, i in zip(prefixes, ids, strict=True)
    ]


def _ack_results(cursor: Cursor[Any]) -> RowMaker[tuple[AckResult, list[str] | None]]:
    """Make (AckResult, wake-ups) from each row of ack: its SELECT list is the result's
    fields in order, then the wake-up payloads (on the first row only)."""
    result = cursor.pgresult
    width = result.nfields if result is not None else 0
    if width != len(AckResult._fields) + 1:
        raise TypeError(f"ack answered {width} columns")
    make = functools.partial(tuple.__new__, AckResult)
    return lambda values: (make(values[:-1]), values[-1])


def _popped_of_pops(cursor: Cursor[Any]) -> RowMaker[tuple[int, Popped]]:
    """Make (pop position, Popped) from each row of pop_many, whose rows after a pop's
    first leave out (NULL) what all of that pop's messages share: taken from its first.
    A row names its message by the bigint id; the API id is made here (api_ids)."""
    result = cursor.pgresult
    names = (
        [] if result is None else [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    )
    if names != ["pop", *POPPED_COLUMNS]:
        raise TypeError(f"pop_many answered columns {names}")
    make = functools.partial(tuple.__new__, Popped)
    api_id = api_ids()
    first: list[Any] = []  # the values of the current pop's first row

    def row(values: Sequence[Any]) -> tuple[int, Popped]:
        ident = api_id(values[1], values[9])
        if values[3] is not None:  # (queue: named on a pop's first row only)
            first[:] = values
            return values[0], make((ident, *values[2:]))
        s = first
        return values[0], make((
            ident, values[2], s[3], s[4], values[5], values[6], values[7], s[8],
            values[9], s[10], s[11], s[12], s[13], s[14], values[15], s[16],
        ))

    return row


def _large_payload(rows: list[tuple[int, Popped]]) -> bool:
    """Tell whether a popped message is over LARGE_CALL_BYTES (its connection is then retired)."""
    return any(len(row.payload) > LARGE_CALL_BYTES for _, row in rows)


def _claims_encrypted(body: bytes | str, items: list[dict[str, Any]]) -> bool:
    """Tell whether a client sent the store's own `encrypted` marker (it must not count).

    The parsed items decide; they are asked only when the body's text holds the key as
    written or a backslash: the key written with JSON escapes (`"\\u0065ncrypted"`) is
    the marker once parsed, and any other body cannot hold it.
    """
    marker, escape = (b'"encrypted"', b"\\") if isinstance(body, bytes) else ('"encrypted"', "\\")
    return (marker in body or escape in body) and any(  # type: ignore[operator]
        "encrypted" in item for item in items
    )


def new_lease_id() -> uuid.UUID:
    """Return a time-ordered lease id (UUIDv7: 48 bits of milliseconds, then random bits)."""
    millis = time.time_ns() // 1_000_000
    value = (millis & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # variant 10
    return uuid.UUID(int=value)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def message_uuid(message_id: int, created_at: dt.datetime) -> uuid.UUID:
    """The API id of a stored message, as queen.message_uuid makes it."""
    millis = ((created_at - _EPOCH) // dt.timedelta(milliseconds=1)) & (2**48 - 1)  # exact
    high = (message_id >> 62) & 0xFFF  # rand_a: the id's bits above the low 62
    return uuid.UUID(
        int=millis << 80 | 0x7 << 76 | high << 64 | 0x2 << 62 | (message_id & (2**62 - 1))
    )


def api_ids() -> Callable[[int, dt.datetime], str]:
    """Return a maker of API ids as text, str(message_uuid(message_id, created_at)).

    Below 2**48 an id only fills the last 12 hex digits, after a prefix that depends on
    created_at alone; the maker keeps the prefix of the last created_at it saw, since a
    pop's messages come in runs pushed together."""
    last: dt.datetime | None = None
    prefix = ""

    def api_id(message_id: int, created_at: dt.datetime) -> str:
        nonlocal last, prefix
        if 0 <= message_id < 1 << 48:
            if created_at != last:
                prefix = str(message_uuid(0, created_at))[:24]
                last = created_at
            return prefix + f"{message_id:012x}"
        return str(message_uuid(message_id, created_at))

    return api_id


def message_id_of(api_id: uuid.UUID) -> int:
    """The bigint id inside an API id (queen.message_id_of)."""
    return ((api_id.int >> 64) & 0xFFF) << 62 | (api_id.int & (2**62 - 1))


class Messages:
    """The message lifecycle: push, pop (a partition lease per group) and ack."""

    def __init__(
        self,
        db: Database,
        queues: Queues,
        encryption_key: str = "",
        fused_calls: int = FUSED_CALLS,
    ) -> None:
        self.db = db
        self.queues = queues
        self._key = crypto.load_key(encryption_key) if encryption_key else None
        # Wake long polls once a push or ack committed (the session defers it: see db.py).
        wakeups = Wakeups(db)
        self.after_push = wakeups.pushed
        self.after_ack = wakeups.freed
        self.give_backs = GiveBacks(db)
        # Pops claimed and not answered yet, for the master to give back if we die
        # (queen.server.claims); the API ends each once its answer is delivered.
        self.claims: InFlight = NOWHERE
        # Called with the pop's connection once its statement ran (tests break it there).
        self.after_pop_statement: AfterExecute | None = None
        # fused_calls 0: no fusion, every request its own call.
        self.fused_calls = fused_calls
        # Told the kind and number of requests of every call (the metrics set it).
        self.observe: Observe = _unobserved
        self.trace: Trace = untraced  # (a tracing span per call, when tracing is on)
        self.turns = NO_TURNS  # (the store's take_turns sets its host's)
        self._push_fusers: dict[str | None, Fuser[_Push, list[PushResult]]] = {}
        self._pops: Fuser[_Pop, list[Popped]] = self._fuser(
            "pop", self._pop_call, limit=FUSED_POPS
        )
        self._acks: Fuser[list[dict[str, Any]], list[AckResult]] = self._fuser(
            "ack", self._ack_call, limit=FUSED_ACKS, size=len
        )

    def _fuser(self, kind: str, run: Any, **options: Any) -> Fuser[Any, Any]:
        return Fuser(
            kind,
            run,
            max_calls=self.fused_calls,
            observe=self._observe,
            trace=lambda kind, requests: self.trace(kind, requests),
            turn=self.turns.of(kind),
            **options,
        )

    def take_turns(self, turns: Turns) -> None:
        """Take turns with the host's other workers at each kind of call (the store's)."""
        self.turns = turns
        fusers: list[Fuser[Any, Any]] = [self._pops, self._acks, *self._push_fusers.values()]
        for fuser in fusers:
            fuser.turn = turns.of(fuser.kind)

    def _observe(self, kind: str, requests: int) -> None:
        self.observe(kind, requests)

    def push(
        self, body: bytes | str, items: list[dict[str, Any]], producer: str | None = None
    ) -> list[PushResult]:
        """Store validated items; body is the raw request ({"items": [...]}) they came from.

        producer: the name of the token that pushed them, kept on each message. Pushes of
        one producer fuse (a call stores one producer name).
        """
        secret = self._secret_items(items) if self.queues.any_encrypted() else None
        if secret is not None or _claims_encrypted(body, items):
            body = self._seal(items, secret)
        text = body if isinstance(body, str) else body.decode()
        fuser = self._push_fusers.get(producer)
        if fuser is None:
            run = functools.partial(self._push_call, producer)
            fuser = self._push_fusers.setdefault(
                producer,
                self._fuser("push", run, limit=FUSED_PUSH_BYTES, size=lambda p: len(p.body)),
            )
        return fuser.submit(_Push(text, items))  # type: ignore[no-any-return]

    def _push_call(
        self, producer: str | None, pushes: list[_Push]
    ) -> list[list[PushResult] | BaseException]:
        """One push statement for pushes; their items are numbered across them.

        Items naming no transactionId go first to push_new, the common push in one
        statement; what it does not store (a queue or partition to make, maxSize) goes to
        push.
        """
        try:
            bodies = pushes[0].body if len(pushes) == 1 else ",".join(p.body for p in pushes)
            params = {"bodies": f"[{bodies}]", "producer": producer}
            items = [item for p in pushes for item in p.items]
            rows, wakes = None, None
            if not any("transactionId" in item for item in items):
                rows, wakes = self._push_new(params, items)
            if rows is None:
                rows = _push_results(self.db.fetch("push", params, _push_rows))
        except InvalidInput:
            if len(pushes) == 1:
                raise
            return self._alone(functools.partial(self._push_call, producer), pushes)
        self.after_push(items, wakes)
        return _renumber(rows, [len(p.items) for p in pushes])

    def _push_new(
        self, params: dict[str, Any], items: list[dict[str, Any]]
    ) -> tuple[list[PushResult] | None, list[str] | None]:
        """The results of push_new, one an item in order, and the wake-up payloads of their
        partitions; (None, None) when it stored nothing."""
        params, slots = push_new_params(params, items)
        ((fits, prefix, ids, made, api_ids, wakes),) = self.db.fetch("push_new", params)
        if not fits:
            return None, None
        idents = api_ids or [f"{prefix}{message_id:012x}" for message_id in ids]
        txids = made_txids(made if len(made) == 1 else [made[s - 1] for s in slots], ids)
        make = functools.partial(tuple.__new__, PushResult)
        return [
            make((k, ident, txid, "queued"))
            for k, (ident, txid) in enumerate(zip(idents, txids, strict=True), 1)
        ], wakes

    @staticmethod
    def _alone(run: Any, requests: list[Any]) -> list[Any]:
        """Run each request in a call of its own: a value the database refused fails only
        the request that sent it."""
        results: list[Any] = []
        for request in requests:
            try:
                (result,) = run([request])
            except QueenError as exc:
                result = exc
            results.append(result)
        return results

    def _secret_items(self, items: list[dict[str, Any]]) -> list[bool] | None:
        """Tell which items go to encrypted queues (None when none does)."""
        secret = [bool((f := self.queues.flags(i["queue"])) and f.encrypted) for i in items]
        return secret if any(secret) else None

    def _seal(self, items: list[dict[str, Any]], secret: list[bool] | None) -> bytes:
        """Rebuild the body: encrypt what goes to encrypted queues; only this sets `encrypted`."""
        if secret is not None and self._key is None:
            raise InvalidInput("queue is encrypted but QUEEN_ENCRYPTION_KEY is not set")
        sealed = []
        for item, is_secret in zip(items, secret or [False] * len(items), strict=True):
            clean = {k: v for k, v in item.items() if k != "encrypted"}
            if is_secret:
                assert self._key is not None
                clean["payload"] = crypto.encrypt(self._key, orjson.dumps(item["payload"]))
                clean["encrypted"] = True
            sealed.append(clean)
        return orjson.dumps({"items": sealed})

    def pop(
        self, route: PopRoute, batch: int, worker: str, prefer: str | None = None
    ) -> list[Popped]:
        """Lease a partition for route's group and return up to batch of its messages.

        prefer: for a route by queue, a partition of it to try first (in the same call).
        """
        lease = new_lease_id()
        params = {
            "kind": route.kind,
            "queue": route.queue,
            "partition": route.partition,
            "namespace": route.namespace,
            "task": route.task,
            "group": route.consumer_group or QUEUE_MODE,
            "mode": route.subscription_mode,
            "since": route.subscription_from.isoformat() if route.subscription_from else None,
            "batch": batch,
            "worker": worker,
            "lease": str(lease),
            "prefer": prefer if route.kind == "queue" else None,
        }
        self.claims.begin(lease)
        try:
            rows: list[Popped] = self._pops.submit(_Pop(params, lease))
        except BaseException:
            self.claims.end((lease,))  # (a claim lost with its connection: give_backs')
            raise
        if not rows:
            self.claims.end((lease,))
        return [self._decrypt(row) if row.encrypted else row for row in rows]

    def _pop_call(self, pops: list[_Pop]) -> list[list[Popped]]:
        """One statement for pops, each leasing a partition of its own."""
        leases = [p.lease for p in pops]

        def lost(backend: Backend) -> None:
            for lease in leases:
                self.give_backs.add(lease, backend)

        def answered(conn: psycopg.Connection[Any]) -> None:
            self._pops.answered()  # the rows are here: the host's next pop call may go
            if self.after_pop_statement is not None:
                self.after_pop_statement(conn)

        if len(pops) == 1:  # (queen.pop itself: no pass of pop_many over its rows)
            rows = self.db.fetch(
                "pop_one", pops[0].params, _popped_of_pops, raw_json=True,
                large=_large_payload, after_execute=answered, on_lost=lost,
            )
        else:
            rows = self.db.fetch(
                "pop_many", {"pops": orjson.dumps([p.params for p in pops]).decode()},
                _popped_of_pops, raw_json=True, large=_large_payload,
                after_execute=answered, on_lost=lost,
            )
        popped: list[list[Popped]] = [[] for _ in pops]
        for position, message in rows:
            popped[position - 1].append(message)
        return popped

    def _decrypt(self, message: Popped) -> Popped:
        if self._key is None:
            raise InvalidInput("message is encrypted but QUEEN_ENCRYPTION_KEY is not set")
        plain = crypto.decrypt(self._key, orjson.loads(message.payload))
        return message._replace(payload=plain.decode())

    def ack(self, acks: list[dict[str, Any]]) -> list[AckResult]:
        """Apply validated acknowledgments; one result per item, in order."""
        return self._acks.submit(acks)  # type: ignore[no-any-return]

    def _ack_call(
        self, requests: list[list[dict[str, Any]]]
    ) -> list[list[AckResult] | BaseException]:
        """One ack statement for the acknowledgments of requests.

        A statement decides a message acked twice by its last acknowledgment: requests
        naming a message an earlier one of the call names go to a statement of their own
        after it, so that each request is answered for its own acknowledgment.
        """
        if len(requests) > 1 and len(rounds := _disjoint(requests)) > 1:
            results: list[list[AckResult] | BaseException] = []
            for part in rounds:
                try:
                    results += self._ack_call(part)
                except QueenError as exc:
                    results += [exc] * len(part)
            return results
        # Requests completing all they name under the leases they name: first as whole
        # leases (ack_whole), one statement for the common call; what that does not end,
        # and requests naming no lease, item by item (ack).
        whole = [
            k for k, r in enumerate(requests)
            if all(a["status"] == "completed" and a.get("leaseId") for a in r)
        ]
        if not whole:
            return self._ack_items(requests)
        tried = [requests[k] for k in whole]
        acks = tried[0] if len(tried) == 1 else [a for r in tried for a in r]
        try:
            if len(requests) == 1 and (params := ack_lease_params(acks)) is not None:
                ((fit, wakes, at),) = self.db.fetch("ack_lease", params)
                if not fit:  # (not that lease whole as popped: no other statement ends it)
                    return self._ack_items(requests)
            else:
                columns = ack_columns(acks, [len(r) for r in tried])
                ((fit, wakes, at),) = self.db.fetch("ack_whole", columns)
        except InvalidInput:
            if len(requests) == 1:
                raise
            return self._alone(self._ack_call, requests)
        if wakes:
            self.after_ack(wakes)
        ended = {whole[k - 1] for k in fit or ()}
        answers: dict[int, list[AckResult] | BaseException] = {
            k: [AckResult(n, a["transactionId"], "completed", 0, at)
                for n, a in enumerate(requests[k], 1)]
            for k in ended
        }
        rest = [k for k in range(len(requests)) if k not in ended]
        if rest:
            try:
                decided = self._ack_items([requests[k] for k in rest])
            except QueenError as exc:  # (the leases ended above stay ended: answered so)
                decided = [exc] * len(rest)
            answers.update(zip(rest, decided, strict=True))
        return [answers[k] for k in range(len(requests))]

    def _ack_items(
        self, requests: list[list[dict[str, Any]]]
    ) -> list[list[AckResult] | BaseException]:
        """The acknowledgments of requests decided item by item where they must be."""
        acks = requests[0] if len(requests) == 1 else [a for r in requests for a in r]
        try:
            columns = ack_columns(acks, [len(r) for r in requests], ranges=False)
            rows = self.db.fetch("ack", columns, _ack_results)
        except InvalidInput:
            if len(requests) == 1:
                raise
            return self._alone(self._ack_items, requests)
        if rows and rows[0][1]:
            self.after_ack(rows[0][1])
        if rows and rows[0][0].position == 0:  # (every item completed a whole lease)
            done = rows[0][0]
            return [
                [AckResult(k, a["transactionId"], done.status, done.retry_count,
                           done.acknowledged_at) for k, a in enumerate(request, 1)]
                for request in requests
            ]
        return _renumber([result for result, _ in rows], [len(r) for r in requests])


ACK_SHARED = ("status", "consumerGroup", "leaseId", "error")


def ack_columns(
    acks: list[dict[str, Any]], sizes: list[int] | None = None, ranges: bool = True
) -> dict[str, str | bool | None]:
    """The parameters of the ack query: validated acknowledgments as parallel arrays
    (text[] literals), each of the optional fields None (a NULL array) when no item names
    it; sizes: how many of them each fused request has (default: one request). When
    every request's items agree on all but their transactionIds (as a batch acked as
    popped does), those arrays hold one value a request (per_request), not one an item.
    lows and highs: the key range each leaseId names (lease_range), when all name one
    (ranges: ack_whole's; the ack statement reads none)."""
    sizes = sizes or [len(acks)]
    firsts = [0, *itertools.accumulate(sizes)][:-1]
    per_request = len(sizes) < len(acks) and all(
        n > 0 and all(a.get(key) == acks[first].get(key)
                      for a in acks[first + 1:first + n] for key in ACK_SHARED)
        for first, n in zip(firsts, sizes, strict=True)
    )
    rows = [acks[first] for first in firsts] if per_request else acks

    def column(key: str) -> str | None:
        values = [a.get(key) for a in rows]
        return text_array(values) if any(v is not None for v in values) else None

    leases: list[str | None] = [a.get("leaseId") for a in rows]
    bounds = [lease_range(lease) for lease in leases if lease] if ranges and all(leases) else None
    return {
        "txids": text_array([a["transactionId"] for a in acks]),
        "groups": column("consumerGroup"),
        "statuses": text_array([a["status"] for a in rows]),
        "errors": column("error"),
        "leases": column("leaseId"),
        "sizes": "{" + ",".join(str(n) for n in sizes) + "}",
        "per_request": per_request,
        "lows": text_array([low for low, _ in bounds]) if bounds else None,
        "highs": text_array([high for _, high in bounds]) if bounds else None,
    }


def lease_range(lease: str) -> tuple[str, str]:
    """The lowest and highest partition ids a lease id names (queen.lease_low and
    queen.lease_high): those sharing its first 6 bytes when it is of queen.lease_in's
    making (version 8), else every partition."""
    value = uuid.UUID(lease).int
    if (value >> 76) & 0xF != 8:
        return str(uuid.UUID(int=0)), str(uuid.UUID(int=2**128 - 1))
    first = value >> 80 << 80
    return str(uuid.UUID(int=first)), str(uuid.UUID(int=first | (2**80 - 1)))


def ack_lease_params(acks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The parameters of ack_lease for one request's acknowledgments, all completed, when
    they name one leaseId and one consumer group; else None."""
    lease, group = acks[0].get("leaseId"), acks[0].get("consumerGroup")
    if lease is None or any(
        a.get("leaseId") != lease or a.get("consumerGroup") != group for a in acks
    ):
        return None
    txids = [a["transactionId"] for a in acks]
    low, high = lease_range(lease)
    return {"lease": lease, "grp": QUEUE_MODE if group is None else group, "size": len(txids),
            "joined": "\x1f".join(txids), "low": low, "high": high}


def _disjoint(requests: list[list[dict[str, Any]]]) -> list[list[list[dict[str, Any]]]]:
    """Cut requests, in order, into runs in which no two requests name the same message."""
    runs: list[list[list[dict[str, Any]]]] = [[]]
    named: set[str] = set()
    for request in requests:
        ids = {a["transactionId"] for a in request}
        if runs[-1] and not ids.isdisjoint(named):
            runs.append([])
            named = set()
        runs[-1].append(request)
        named |= ids
    return runs


def _unobserved(kind: str, requests: int) -> None:
    return None


def _renumber(rows: list[Any], sizes: list[int]) -> list[Any]:
    """Cut a fused call's rows (one per item, positions across the call) into each
    request's own, positions counted in that request."""
    if len(sizes) == 1:
        return [rows]
    parts = split(rows, sizes)
    offset = 0
    for part, size in zip(parts, sizes, strict=True):
        if offset:
            part[:] = [row._replace(position=row.position - offset) for row in part]
        offset += size
    return parts
