-- Statements of the maintenance session on the cursor store (queen.store.maintenance), by name.

-- maintenance_cursor_expire_leases: end expired leases of the cursor store (retry, DLQ or failed), wake polls --
SELECT leases, messages, next_expiry_in FROM queen.cursor_expire(%(limit)s)

-- maintenance_cursor_wake_due: wake polls for partitions whose retryDelay ended or whose delayed/windowed messages became due --
SELECT woken, next_due_in, scanned_at FROM queen.cursor_wake_due(%(since)s)

-- maintenance_cursor_ttl: dead-letter messages past their queue's ttl that nobody popped, at most limit --
SELECT queen.cursor_maintain_ttl(%(limit)s)

-- maintenance_cursor_retention: delete messages past their queue's retention, at most limit --
SELECT queen.cursor_retention(%(limit)s)

-- maintenance_cursor_cleanup_partitions: remove partitions without messages or live leases, idle for idle_s seconds, at most limit --
SELECT queen.cursor_cleanup_partitions(%(idle_s)s, %(limit)s)

-- maintenance_cursor_analyze: ANALYZE the cursor tables that changed by a tenth --
SELECT queen.cursor_analyze(%(min_changes)s)
