"""The connection pool and the one place that turns driver errors into queen.errors."""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from select import POLLIN
from typing import Any, NamedTuple, Self

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.pq import TransactionStatus
from psycopg.rows import RowFactory, tuple_row
from psycopg_pool import ConnectionPool, PoolTimeout
from psycopg_pool.pool import AddConnection

from queen.errors import InvalidInput, Unavailable
from queen.store.bounds import WATCHDOG, bounded_conninfo, call_deadline_s
from queen.store.sqlfile import load_queries, query_name

try:  # the unpatched poll: a zero-timeout look must not yield to the gevent hub
    from gevent.hub import Waiter, get_hub
    from gevent.monkey import get_original, is_module_patched

    _poll = get_original("select", "poll")
except ImportError:  # pragma: no cover - gevent is a dependency
    import select

    _poll = select.poll

log = logging.getLogger(__name__)

# What Database.observe is told of each statement a pooled connection runs: the query's
# name (queen.store.sqlfile.query_name; "transaction" for the commit of a transaction
# block), whether a statement ran, whether it committed.
StatementObserver = Callable[[str, bool, bool], None]

QUERIES = load_queries()
RETRIES_ON_DEADLOCK = 3
# The pool doubles the pause between connection attempts for this long, then gives up
# until the next request asks again (and starts over at 1 s). Without a bound the pause
# grows with the outage: after 10 minutes down, the next attempt could be 8 minutes away.
RECONNECT_WINDOW_S = 5.0
PROBE_EVERY_S = 1.0  # seconds between requests let through to the pool during an outage
PROBE_WAIT_S = 0.2  # seconds such a request waits (the attempt it starts goes on)
# libpq keeps a connection's buffers as large as the largest message they carried: a call
# that sent or received more than this closes its connection afterwards (the pool makes a
# new one), so a worker does not keep a huge body's worth of memory per pooled connection.
LARGE_CALL_BYTES = 4 * 1024 * 1024
# Class 40: the statement was rolled back and may simply be run again. psycopg derives
# these from OperationalError, not from TransactionRollback, so they are listed.
RETRYABLE = (
    pg_errors.TransactionRollback,
    pg_errors.DeadlockDetected,
    pg_errors.SerializationFailure,
)
READ_ONLY = "database is read-only (a standby, or a primary being demoted); nothing was applied"


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Re-raise driver errors as domain errors, keeping the original as __cause__."""
    try:
        yield
    except PoolTimeout as exc:
        raise Unavailable("no database connection available") from exc
    except RETRYABLE:
        raise  # deadlock or serialization failure: Database.fetch retries
    except pg_errors.QueryCanceled as exc:
        raise Unavailable("database statement timed out; nothing was applied") from exc
    except pg_errors.ReadOnlySqlTransaction as exc:
        raise Unavailable(READ_ONLY) from exc
    except pg_errors.DataError as exc:
        # Class 22: a value the client sent cannot be stored (NUL in text, bad unicode…).
        detail = exc.diag.message_primary or "invalid value"
        raise InvalidInput(f"invalid input: {detail}") from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise Unavailable("database unavailable") from exc


def returns_rows(cursor: psycopg.Cursor[Any]) -> bool:
    """Tell whether the statement just run returned rows (a result set, even empty).

    Cheaper than `cursor.description`, which builds an object per column at each call.
    """
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


def wait_on_hub(gen: Any, fileno: int) -> Any:
    """Run a psycopg generator to its end, waiting for the socket on the gevent hub.

    psycopg's Wait and Ready values are libev's READ and WRITE bits, so a step's wish
    is the watcher's events and the events it fired with are the step's answer.
    """
    hub = get_hub()
    try:
        wanted = next(gen)
        while True:
            watcher = hub.loop.io(fileno, wanted)
            waiter: Waiter[int] = Waiter(hub)
            watcher.start(waiter.switch, pass_events=True)
            try:
                ready = waiter.get() & 3
            finally:
                watcher.close()
            if not ready:  # an error on the descriptor, not readiness
                raise psycopg.OperationalError("connection socket closed")
            wanted = gen.send(ready)
    except StopIteration as done:
        return done.value


class QueenConnection(psycopg.Connection[Any]):
    """A pooled connection that tells its observer (set by Database) of every commit of a
    transaction block; its cursors (CountingCursor) tell it of every statement."""

    @contextlib.contextmanager
    def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> Iterator[psycopg.Transaction]:
        outermost = self.info.transaction_status == TransactionStatus.IDLE
        with super().transaction(savepoint_name, force_rollback) as tx:
            yield tx
        observe = getattr(self, "_queen_observe", None)
        if observe is not None and outermost and not force_rollback:
            observe(None, True)


class CountingCursor(psycopg.Cursor[Any]):
    """A cursor that tells its connection's observer of each statement it runs, and
    whether the statement committed (autocommit, outside a transaction block)."""

    def execute(
        self,
        query: Any,
        params: Any = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> Self:
        ran = False
        try:
            super().execute(query, params, prepare=prepare, binary=binary)
            ran = True
            return self
        finally:
            observe = getattr(self.connection, "_queen_observe", None)
            if observe is not None:
                idle = self.connection.info.transaction_status == TransactionStatus.IDLE
                observe(query, ran and idle)


class HubConnection(QueenConnection):
    """A connection that waits for its socket on the gevent hub itself.

    Under gevent psycopg waits through the patched select.poll: a poll object, a
    registration and a result per wait, and a wake-up every 0.1 s to notice Ctrl-C (the
    hub handles signals in a worker). One io watcher per step of the exchange does the
    same job for less CPU per query. Waits with a timeout (cancelling, the
    pool's checks) keep psycopg's own.
    """

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        if timeout is not None:
            return super().wait(gen, interval, timeout)
        return wait_on_hub(gen, self.pgconn.socket)


def connection_class() -> type[QueenConnection]:
    """Return HubConnection where psycopg itself waits cooperatively (gevent patched first),
    QueenConnection (psycopg's own waiting) elsewhere."""
    import psycopg.waiting

    cooperative = psycopg.waiting.wait is not getattr(psycopg.waiting, "wait_c", None)
    return HubConnection if cooperative and is_module_patched("select") else QueenConnection


class Backend(NamedTuple):
    """The server process a pooled connection talks to, and when its server started."""

    pid: int
    server_started: datetime.datetime | None


class Outage:
    """Fail fast while the database is known to be unreachable (a circuit breaker).

    Opened when a connection attempt fails (or no connection came within the timeout
    with none in the pool), closed when a connection is made. While open, requests
    answer 503 at once, except one every PROBE_EVERY_S, which asks the pool (and so makes
    it try to reconnect) for PROBE_WAIT_S at most.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.since: float | None = None  # when the outage began; None: no outage known
        self._probe_at = 0.0
        self._lock = threading.Lock()

    def failed(self) -> None:
        with self._lock:
            if self.since is None:
                self.since = self.clock()
                self._probe_at = self.since + PROBE_EVERY_S
                log.warning("database unreachable: failing fast until a connection succeeds")

    def recovered(self) -> None:
        if self.since is None:
            return
        with self._lock:
            if self.since is not None:
                log.warning("database reachable again after %.1fs", self.clock() - self.since)
                self.since = None

    def admit(self, wait_s: float) -> float | None:
        """Return how long this request may wait for a connection (wait_s, unless an
        outage is known); None: fail now."""
        if self.since is None:
            return wait_s
        with self._lock:
            now = self.clock()
            if self.since is None:
                return wait_s
            if now < self._probe_at:
                return None
            self._probe_at = now + PROBE_EVERY_S
            return min(wait_s, PROBE_WAIT_S)


def _sent_bytes(params: Mapping[str, Any] | None) -> int:
    """Return about how much the text and bytes parameters of a call weigh."""
    if not params:
        return 0
    return sum(len(value) for value in params.values() if isinstance(value, str | bytes))


def text_array(values: Sequence[str | None]) -> str:
    """Write strings as a PostgreSQL text[] literal (None: NULL), for a %s::text[] parameter.

    psycopg adapts a list element by element in Python; one literal per array costs the
    worker a small fraction of that.
    Every element is quoted, so braces, commas, blanks and the word NULL stay text;
    backslash and double quote are the two characters a quoted element escapes.
    """
    return "{" + ",".join("NULL" if v is None else _quoted(v) for v in values) + "}"


def _quoted(value: str) -> str:
    if "\\" in value or '"' in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + value + '"'


def closed_by_server(conn: psycopg.Connection[Any]) -> bool:
    """Tell whether an idle connection has something to read: the server ended it (or said so).

    An idle pooled connection receives nothing (it does not LISTEN); a backend that was
    terminated or crashed leaves an error message or EOF behind. One system call, no
    round trip.
    """
    try:
        poller = _poll()
        poller.register(conn.pgconn.socket, POLLIN)
        return bool(poller.poll(0))
    except (OSError, psycopg.Error):
        return True


class LifoPool(ConnectionPool):
    """A ConnectionPool that hands out the connection returned last, alive.

    psycopg_pool hands out the connection idle longest, so consecutive requests rotate
    through every pooled backend, and at low load each one finds its backend asleep
    and its caches cold, and a call takes markedly longer than on the connection used
    last. Idle
    connections still close oldest first (max_idle), from the other end.
    A connection the server closed while it was idle is replaced, not handed out.
    Connection attempts open and close `outage`; a failed one also answers the requests
    already waiting for a connection, which would otherwise wait their whole timeout
    while the pool retries.
    tests/integration/test_lifo_pool.py fails if psycopg_pool stops calling these methods.
    """

    outage: Outage | None = None

    def _get_ready_connection(self, timeout: float | None) -> Any:
        while self._pool and (timeout is None or timeout > 0.0):
            conn = self._pool.pop()  # the newest, where the base class takes the oldest
            if len(self._pool) < self._nconns_min:
                self._nconns_min = len(self._pool)
            if not closed_by_server(conn):
                return conn
            log.warning("replacing a pooled connection the server closed")
            self._stats[self._CONNECTIONS_LOST] += 1
            self._close_connection(conn)
            self.run_task(AddConnection(self))
        return super()._get_ready_connection(timeout)

    def _connect(self, timeout: float | None = None) -> Any:
        try:
            conn = super()._connect(timeout)
        except Exception:
            if self.outage is not None:
                self.outage.failed()
                self._fail_waiting()
            raise
        if self.outage is not None:
            self.outage.recovered()
        return conn


    def retire(self, conn: psycopg.Connection[Any]) -> None:
        """Close conn when it is given back instead of pooling it again (a new one replaces it)."""
        conn._expire_at = float("-inf")  # type: ignore[attr-defined]  # psycopg_pool's own

    def _fail_waiting(self) -> None:
        """Fail every request waiting for a connection: the database refused a new one."""
        with self._lock:
            while self._waiting:
                self._waiting.popleft().fail(PoolTimeout("the database refused a connection"))


class Database:
    """A psycopg pool with named queries; create one per process, after fork."""

    def __init__(
        self,
        dsn: str,
        *,
        pool_size: int = 10,
        timeout_s: float = 5.0,
        statement_timeout_ms: int = 30000,
        hot_path_timeout_ms: int = 5000,
        application_name: str = "queen",
    ) -> None:
        self.dsn = dsn
        self.queries = QUERIES
        # Told (query name, whether a statement ran, whether it committed) of what the
        # pooled connections run: the /metrics counts of statements and commits.
        self.observe: StatementObserver | None = None
        # Connections run under the hot path's short statement_timeout; patient calls
        # (admin, reads, dashboard) raise their own for their transaction.
        self._hot_path_timeout_ms = hot_path_timeout_ms
        self._statement_timeout_ms = statement_timeout_ms
        self.outage = Outage()
        self.pool = LifoPool(
            bounded_conninfo(dsn),
            min_size=1,
            max_size=max(1, pool_size),
            timeout=timeout_s,
            open=False,
            name=application_name,
            kwargs={"autocommit": True, "application_name": application_name},
            connection_class=connection_class(),
            configure=self._configure,
            reconnect_timeout=RECONNECT_WINDOW_S,
        )
        self.pool.outage = self.outage

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(
            "SELECT set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', '60s', false),"
            # Timestamps arrive in UTC, ready to format (queen.models.iso).
            " set_config('TimeZone', 'UTC', false),"
            # Pushes wake long polls after they commit (queen.store.polling.Wakeups).
            " set_config('queen.push_notify', 'after_commit', false),"
            # Prepared statements keep one plan per session: left to choose, PostgreSQL
            # may plan a hot call afresh every time (docs/DECISIONS.md). Reads, the
            # dashboard and admin actions choose again, for their transaction.
            " set_config('plan_cache_mode', 'force_generic_plan', false),"
            # No JIT: compiling costs many times what these short statements take, and
            # a generic plan's estimates grow with the tables, past jit_above_cost.
            " set_config('jit', 'off', false),"
            " pg_postmaster_start_time()",
            (str(self._hot_path_timeout_ms),),
        ).fetchone()
        conn._queen_server_started = row[-1] if row else None  # type: ignore[attr-defined]
        conn.cursor_factory = CountingCursor
        conn._queen_observe = self._observed  # type: ignore[attr-defined]

    def _observed(self, statement: object, committed: bool) -> None:
        """A pooled connection ran statement (None: it committed a transaction block)."""
        observe = self.observe
        if observe is not None:
            if statement is None:
                observe("transaction", False, committed)
            else:
                observe(query_name(statement), True, committed)

    def open(self) -> None:
        """Start the pool without waiting for the database (requests answer 503 until it is up)."""
        self.pool.open(wait=False)

    def close(self) -> None:
        self.pool.close()

    @contextlib.contextmanager
    def connection(
        self,
        on_lost: Callable[[Backend], None] | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> Iterator[psycopg.Connection[Any]]:
        """Borrow an autocommit connection, with errors translated and the borrow bounded.

        The borrow ends within the hot path's statement timeout plus a margin, or within
        timeout_ms plus the margin for a caller that sets that statement_timeout itself;
        past it the connection is severed and the call answers 503, saying it may or may
        not have been applied. During a known outage this raises Unavailable at once (see
        Outage). When the connection breaks while borrowed, on_lost gets its Backend
        before the error goes on: what was sent may have committed.
        """
        wait_s = self.outage.admit(self.pool.timeout)
        if wait_s is None:
            raise Unavailable("database unavailable (failing fast until it answers)")
        bound = call_deadline_s(self._hot_path_timeout_ms if timeout_ms is None else timeout_ms)
        with translate_errors():
            conn = self._getconn(wait_s)
            backend = Backend(conn.info.backend_pid, getattr(conn, "_queen_server_started", None))
            deadline = None
            try:
                with conn, WATCHDOG.guard(conn, bound) as deadline:
                    yield conn
            except pg_errors.ReadOnlySqlTransaction:
                self.pool.retire(conn)  # its replacement may reach the new primary
                raise
            except Exception as exc:
                if on_lost is not None and conn.broken:
                    on_lost(backend)
                if deadline is not None and deadline.passed:
                    raise Unavailable(
                        f"the database did not answer within {deadline.seconds:g}s; the call"
                        " may or may not have been applied (retry with the same transactionId)"
                    ) from exc
                raise
            finally:
                self.pool.putconn(conn)

    def _getconn(self, wait_s: float) -> psycopg.Connection[Any]:
        try:
            conn = self.pool.getconn(wait_s)
        except PoolTimeout:
            if not self.pool.get_stats().get("pool_size"):
                self.outage.failed()  # no connection came, and none is left: down
            raise
        self.outage.recovered()
        return conn

    def fetch(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        row_factory: RowFactory[Any] = tuple_row,
        *,
        raw_json: bool = False,
        after_execute: Callable[[psycopg.Connection[Any]], None] | None = None,
        on_lost: Callable[[Backend], None] | None = None,
        large: Callable[[list[Any]], bool] | None = None,
        patient: bool = False,
    ) -> list[Any]:
        """Run the named query and return all rows; retry deadlocks (each call is atomic).

        patient: run under the longer statement timeout of calls off the hot path (admin
        actions), in a transaction of its own.

        after_execute: called with the connection once the statement has run, before its
        rows are read (tests break the connection there).
        on_lost: called as in connection() when the answer is lost with the connection.
        large: tells whether the rows hold a value over LARGE_CALL_BYTES (parameters are
        weighed here), after which the connection is retired.
        """
        statement = QUERIES[name]
        for attempt in range(RETRIES_ON_DEADLOCK):
            try:
                timeout_ms = self._statement_timeout_ms if patient else None
                with self.connection(on_lost, timeout_ms=timeout_ms) as conn:
                    with conn.transaction() if patient else contextlib.nullcontext():
                        if patient:
                            conn.execute(QUERIES["transaction_statement_timeout"], {"ms": str(timeout_ms)})
                        cur = conn.cursor(row_factory=row_factory)
                        if raw_json:
                            cur.adapters.register_loader("jsonb", psycopg.types.string.TextLoader)
                        cur.execute(statement, params)
                        if after_execute is not None:
                            after_execute(conn)
                        rows = cur.fetchall() if returns_rows(cur) else []
                    if _sent_bytes(params) > LARGE_CALL_BYTES or (large and large(rows)):
                        self.pool.retire(conn)
                    return rows
            except RETRYABLE as exc:
                if attempt == RETRIES_ON_DEADLOCK - 1:
                    raise Unavailable("database busy (deadlock), retry") from exc
                log.warning("retrying %s after %s", name, type(exc).__name__)
            except Unavailable as exc:
                # A read-only server applied nothing: once more, on a new connection
                # (a failover's new primary, when the old one's connection was pooled).
                if attempt or not isinstance(exc.__cause__, pg_errors.ReadOnlySqlTransaction):
                    raise
                log.warning("retrying %s on a new connection: %s", name, exc.message)
        raise AssertionError("unreachable")

    def stats(self) -> dict[str, int]:
        """Return the pool's size, idle and waiting counts."""
        s = self.pool.get_stats()
        return {
            "size": s.get("pool_size", 0),
            "idle": s.get("pool_available", 0),
            "waiting": s.get("requests_waiting", 0),
            "max": self.pool.max_size,
        }
