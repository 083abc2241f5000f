-- Runtime statements, by name. DDL and the functions they call live in sql/.

-- push: insert the items of a push body ({"items": [...]}), one row per item --
SELECT idx, message_id, transaction_id, status FROM queen.push(%(body)s::jsonb -> 'items')

-- pop_partition: claim up to batch messages from one named partition --
SELECT * FROM queen.pop_partition(%(queue)s, %(partition)s, %(batch)s, %(worker)s)

-- pop_queue: claim up to batch messages from the oldest free partition of a queue --
SELECT * FROM queen.pop_queue(%(queue)s, %(batch)s, %(worker)s)

-- pop_filtered: claim up to batch messages across queues by namespace/task and priority --
SELECT * FROM queen.pop_filtered(%(namespace)s, %(task)s, %(batch)s, %(worker)s)

-- ack: acknowledge a batch, one row per acknowledgment in request order --
SELECT idx, transaction_id, status, retry_count, now() AS acknowledged_at
FROM queen.ack(%(acks)s::jsonb)

-- create_queue: make sure a queue exists (its options start at the schema defaults) --
INSERT INTO queen.queues (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING

-- configure_queue: set the given options of a queue; NULL keeps the current value --
UPDATE queen.queues SET
    namespace = coalesce(%(namespace)s, namespace),
    task = coalesce(%(task)s, task),
    lease_time = coalesce(%(lease_time)s, lease_time),
    retry_limit = coalesce(%(retry_limit)s, retry_limit),
    priority = coalesce(%(priority)s, priority),
    max_size = coalesce(%(max_size)s, max_size),
    ttl = coalesce(%(ttl)s, ttl),
    dlq_after_max_retries = coalesce(%(dlq_after_max_retries)s, dlq_after_max_retries),
    delayed_processing = coalesce(%(delayed_processing)s, delayed_processing),
    window_buffer = coalesce(%(window_buffer)s, window_buffer),
    retention_seconds = coalesce(%(retention_seconds)s, retention_seconds),
    completed_retention_seconds = coalesce(%(completed_retention_seconds)s, completed_retention_seconds),
    retention_enabled = coalesce(%(retention_enabled)s, retention_enabled),
    encryption_enabled = coalesce(%(encryption_enabled)s, encryption_enabled),
    max_wait_time_seconds = coalesce(%(max_wait_time_seconds)s, max_wait_time_seconds),
    updated_at = now()
WHERE name = %(name)s
RETURNING *

-- queue_flags: encryption flag and long-poll cap of every queue (cached per process) --
SELECT name, encryption_enabled, max_wait_time_seconds FROM queen.queues

-- ping: cheapest round trip, for health checks --
SELECT 1
