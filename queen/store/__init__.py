"""The only code that talks SQL. Store bundles one object per family over one pool."""

from __future__ import annotations

from queen.config import Settings
from queen.store.admin import Admin
from queen.store.analytics import Analytics
from queen.store.cursor_admin import CURSOR_READ_QUERIES, CursorAdmin, cursor_reads
from queen.store.cursor_messages import CursorLeases, CursorMessages, CursorPolling
from queen.store.dashboard import Dashboard, MessagePlace
from queen.store.db import Database
from queen.store.groups import ConsumerGroups
from queen.store.leases import Leases
from queen.store.messages import Messages
from queen.store.polling import Polling
from queen.store.queues import Queues
from queen.store.reads import Reads
from queen.store.tokens import Tokens
from queen.store.transactions import Transactions

STORAGES = ("rows", "cursors")


class Store:
    """Everything the API and the workers ask of PostgreSQL."""

    def __init__(self, db: Database, encryption_key: str = "", storage: str = "cursors") -> None:
        if storage not in STORAGES:
            raise ValueError(f"storage must be one of {', '.join(STORAGES)}, not {storage!r}")
        self.db = db
        self.storage = storage  # rows | cursors: which model the families below run on
        self.cursors = storage == "cursors"
        self.queues = Queues(db)
        self.messages: Messages
        self.polling: Polling
        self.leases: Leases | CursorLeases
        self.admin: Admin
        if self.cursors:  # the read side over cursor_* too (statuses derived)
            self.messages = CursorMessages(db, self.queues, encryption_key)
            self.polling = CursorPolling(db)
            self.leases = CursorLeases(db)
            self.dashboard = Dashboard(db, queries=CURSOR_READ_QUERIES)
            self.reads = cursor_reads(db)
            self.admin = CursorAdmin(db, self.reads, encryption_key)
        else:
            self.messages = Messages(db, self.queues, encryption_key)
            self.polling = Polling(db)
            self.leases = Leases(db)
            self.dashboard = Dashboard(db)
            self.reads = Reads(db)
            self.admin = Admin(db, self.reads, encryption_key)
        self.messages.after_push = self.polling.push_wakeups.pushed
        self.analytics = Analytics(self.reads)
        self.tokens = Tokens(db)
        # The cursor store's consumer groups and transactions (QUEEN_STORAGE=cursors only).
        self.groups = ConsumerGroups(db)
        self.transactions = Transactions(db, self.queues, encryption_key)
        self.transactions.after_push = self.polling.push_wakeups.pushed

    @classmethod
    def from_settings(cls, settings: Settings, application_name: str = "queen") -> Store:
        db = Database(
            settings.dsn,
            pool_size=settings.db_pool_size,
            timeout_s=settings.db_timeout_ms / 1000,
            statement_timeout_ms=settings.statement_timeout_ms,
            application_name=application_name,
        )
        return cls(db, settings.encryption_key, settings.storage)

    def locate_messages(self, transaction_ids: list[str]) -> dict[str, MessagePlace]:
        """Map transactionIds to their queue and partition in the storage in use."""
        return self.dashboard.locate(transaction_ids)

    def open(self) -> None:
        self.db.open()

    def close(self) -> None:
        self.messages.give_backs.close()
        self.db.close()

    def ping(self) -> None:
        """Raise Unavailable unless the database answers."""
        self.db.fetch("ping")
