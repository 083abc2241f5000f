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

-- dashboard_statement_timeout: keep a dashboard query short (applies to its transaction only) --
SELECT set_config('statement_timeout', %(ms)s, true)

-- dashboard_depths: current counts of every partition with its queue; queues without partitions too --
SELECT q.name AS queue, q.namespace, q.task, p.name AS partition,
       coalesce(s.pending, 0) AS pending, coalesce(s.processing, 0) AS processing,
       coalesce(s.completed, 0) AS completed, coalesce(s.failed, 0) AS failed,
       coalesce(s.dead_letter, 0) AS dead_letter
FROM queen.queues q
LEFT JOIN queen.partitions p ON p.queue_id = q.id
LEFT JOIN queen.partition_stats s ON s.partition_id = p.id
ORDER BY q.name, p.name

-- dashboard_recent: messages created and completed in the last complete minute (folded metrics) --
SELECT coalesce(sum(incoming), 0)::bigint AS created, coalesce(sum(completed), 0)::bigint AS completed
FROM queen.metrics_minute
WHERE minute = date_trunc('minute', now()) - interval '1 minute'

-- dashboard_locate: queue and partition of messages named by transactionId --
SELECT m.transaction_id, q.name AS queue, p.name AS partition
FROM queen.messages m
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE m.transaction_id = ANY (%(ids)s::text[])

-- dashboard_throughput: per-minute activity of the last minutes (optionally one queue), gaps as zeros --
SELECT g.minute,
       coalesce(sum(m.incoming), 0)::bigint AS incoming,
       coalesce(sum(m.popped), 0)::bigint AS popped,
       coalesce(sum(m.completed), 0)::bigint AS completed,
       coalesce(sum(m.failed), 0)::bigint AS failed,
       coalesce(sum(m.dead_letter), 0)::bigint AS dead_letter
FROM generate_series(date_trunc('minute', now()) - (%(minutes)s - 1) * interval '1 minute',
                     date_trunc('minute', now()), interval '1 minute') AS g(minute)
LEFT JOIN queen.metrics_minute m
       ON m.minute = g.minute AND (%(queue)s::text IS NULL OR m.queue = %(queue)s::text)
GROUP BY g.minute
ORDER BY g.minute
