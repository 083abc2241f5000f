"""The only code that talks SQL. Store bundles one object per family over one pool."""

from __future__ import annotations

from queen.config import Settings
from queen.errors import Unavailable
from queen.fusion import FUSED_CALLS, Observe, Trace
from queen.server.turns import Turns
from queen.store.admin import Admin
from queen.store.analytics import Analytics
from queen.store.dashboard import Dashboard, MessagePlace
from queen.store.db import READ_ONLY, Database
from queen.store.groups import ConsumerGroups
from queen.store.leases import Leases
from queen.store.messages import Messages
from queen.store.polling import Polling
from queen.store.queues import Queues
from queen.store.reads import Reads
from queen.store.tokens import Tokens
from queen.store.transactions import Transactions


class Store:
    """Everything the API and the workers ask of PostgreSQL."""

    def __init__(
        self, db: Database, encryption_key: str = "", fused_calls: int = FUSED_CALLS
    ) -> None:
        self.db = db
        self.queues = Queues(db)
        self.messages = Messages(db, self.queues, encryption_key, fused_calls)
        self.polling = Polling(db)
        self.messages.after_push = self.polling.wakeups.pushed
        self.messages.after_ack = self.polling.wakeups.freed
        self.leases = Leases(db, fused_calls)
        self.dashboard = Dashboard(db)
        self.reads = Reads(db)
        self.admin = Admin(db, self.reads, encryption_key)
        self.analytics = Analytics(self.reads)
        self.tokens = Tokens(db)
        self.groups = ConsumerGroups(db)
        self.transactions = Transactions(db, self.queues, encryption_key)
        self.transactions.after_push = self.polling.wakeups.pushed

    @classmethod
    def from_settings(cls, settings: Settings, application_name: str = "queen") -> Store:
        db = Database(
            settings.dsn,
            pool_size=settings.db_pool_size,
            timeout_s=settings.db_timeout_ms / 1000,
            statement_timeout_ms=settings.statement_timeout_ms,
            hot_path_timeout_ms=settings.hot_path_timeout_ms,
            application_name=application_name,
        )
        return cls(db, settings.encryption_key, settings.fused_calls)

    def take_turns(self, turns: Turns) -> None:
        """Take turns at each kind of fused call with the host's other workers (one call of
        a kind in flight a worker, the default; queen.server.turns)."""
        if self.messages.fused_calls == 1:
            self.messages.take_turns(turns)
            self.leases.take_turns(turns)

    def observe_calls(self, observe: Observe) -> None:
        """Tell observe(kind, requests) of every push, pop, ack and lease-renewal call."""
        self.messages.observe = observe
        self.leases.observe = observe

    def trace_calls(self, trace: Trace) -> None:
        """Enter trace(kind, requests) around every push, pop, ack and lease-renewal call."""
        self.messages.trace = trace
        self.leases.trace = trace

    def locate_messages(self, transaction_ids: list[str]) -> dict[str, MessagePlace]:
        """Map transactionIds to their queue and partition."""
        return self.dashboard.locate(transaction_ids)

    def open(self) -> None:
        self.db.open()

    def close(self) -> None:
        self.messages.give_backs.close()
        self.db.close()

    def ping(self) -> None:
        """Raise Unavailable unless the database answers."""
        ((writable,),) = self.db.fetch("ping")
        if not writable:
            raise Unavailable(READ_ONLY)

    def schema_problem(self) -> str | None:
        """Return why the database's schema is not this build's, None when it is."""
        from queen.store.migrate import schema_problem

        with self.db.connection() as conn:
            return schema_problem(conn)
