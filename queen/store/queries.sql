-- Runtime statements, by name. DDL and the functions they call live in sql/.

-- push: insert the items of a push body ({"items": [...]}), one row per item --
SELECT idx, message_id, transaction_id, status
FROM queen.push(%(body)s::jsonb -> 'items', %(producer)s)

-- pop_partition: claim up to batch messages from one named partition --
SELECT * FROM queen.pop_partition(%(queue)s, %(partition)s, %(batch)s, %(worker)s, %(lease)s)

-- pop_queue: claim up to batch messages from the oldest free partition of a queue --
SELECT * FROM queen.pop_queue(%(queue)s, %(batch)s, %(worker)s, %(lease)s)

-- pop_queue_preferring: claim from one partition of a queue if it is free, else from the queue --
SELECT * FROM queen.pop_queue_preferring(%(queue)s, %(partition)s, %(batch)s, %(worker)s,
    %(lease)s)

-- pop_filtered: claim up to batch messages across queues by namespace/task and priority --
SELECT * FROM queen.pop_filtered(%(namespace)s, %(task)s, %(batch)s, %(worker)s, %(lease)s)

-- notify_pushed: wake long polls for pushes that committed (one transaction, asynchronous commit) --
SELECT queen.notify_pushed(%(queues)s::text[], %(partitions)s::text[])

-- list_waiting_worker: list this worker as having parked polls, for the next seconds --
SELECT queen.list_waiting_worker(%(worker)s, %(seconds)s)

-- unclaim: give back a claim whose response never reached the client (no retry counted) --
SELECT queen.unclaim(%(lease)s, %(transaction_ids)s::text[])

-- give_back_claim: give back a claim whose answer was lost with its connection; NULL: not yet --
SELECT queen.give_back_claim(%(lease)s, %(backend)s)

-- ready_partitions: wake payloads of free partitions with pending work for the parked polls' routes --
SELECT payload FROM queen.ready_partitions(
    %(queues)s::text[], %(partition_queues)s::text[], %(partitions)s::text[],
    %(namespaces)s::text[], %(tasks)s::text[], %(limit)s) AS payload

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
    retry_delay = coalesce(%(retry_delay)s, retry_delay),
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

-- dashboard_notify: one dashboard batch or presence note to every worker's listener --
SELECT pg_notify(%(channel)s, %(payload)s)

-- maintenance_setup: session settings of the maintenance connection (timeouts, keepalives, plans) --
-- Every maintenance statement walks an index in order under a LIMIT; a bitmap scan would
-- read a whole partition and sort it. JIT only adds compile time to these short statements.
SELECT set_config('statement_timeout', %(statement_ms)s, false),
       set_config('enable_bitmapscan', 'off', false),
       set_config('jit', 'off', false),
       set_config('lock_timeout', %(lock_ms)s, false),
       set_config('idle_in_transaction_session_timeout', '60s', false),
       set_config('tcp_keepalives_idle', '10', false),
       set_config('tcp_keepalives_interval', '3', false),
       set_config('tcp_keepalives_count', '3', false),
       set_config('client_connection_check_interval', '1s', false)

-- maintenance_try_lead: take the maintenance leader lock for this session, without waiting --
SELECT pg_try_advisory_lock(%(key)s)

-- maintenance_leader: application_name of the session holding the maintenance leader lock --
SELECT a.application_name
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
          SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid::bigint = (%(key)s::bigint >> 32) AND l.objid::bigint = (%(key)s::bigint & 4294967295)
  AND l.objsubid = 1

-- maintenance_expire_leases: release expired partition leases (retry, DLQ or failed), wake polls --
SELECT leases, messages, next_expiry_in FROM queen.expire_leases(%(limit)s)

-- maintenance_wake_due: wake polls for delayed/windowed partitions that became due since the last scan --
SELECT woken, next_due_in, scanned_at FROM queen.wake_due(%(since)s)

-- maintenance_timed_queues: queues whose messages become poppable later (delayedProcessing, windowBuffer) --
SELECT name, delayed_processing, window_buffer FROM queen.queues
WHERE delayed_processing > 0 OR window_buffer > 0

-- maintenance_expire_ttl: pending messages older than their queue's ttl go to dead_letter, at most limit --
WITH moved AS (
    UPDATE queen.messages m
    SET status = 'dead_letter', failed_at = now(), error_message = 'ttl expired'
    WHERE m.transaction_id = ANY (ARRAY(SELECT queen.overdue_pending('ttl', %(limit)s)))
    RETURNING m.partition_id
), counted AS (
    INSERT INTO queen.status_deltas (partition_id, from_status, to_status, n)
    SELECT partition_id, 'pending', 'dead_letter', count(*) FROM moved GROUP BY 1
)
SELECT count(*) FROM moved

-- maintenance_retention_pending: delete pending messages older than retentionSeconds, at most limit --
WITH gone AS (
    DELETE FROM queen.messages m
    WHERE m.transaction_id = ANY (ARRAY(SELECT queen.overdue_pending('retention', %(limit)s)))
    RETURNING 1
)
SELECT count(*) FROM gone

-- maintenance_retention_completed: delete completed messages older than completedRetentionSeconds, at most limit --
WITH parts AS (
    SELECT p.id, now() - make_interval(secs => q.completed_retention_seconds) AS cutoff
    FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
    WHERE q.retention_enabled AND q.completed_retention_seconds > 0
), doomed AS (
    SELECT m.transaction_id
    FROM parts p CROSS JOIN LATERAL (
        SELECT x.transaction_id FROM queen.messages x
        WHERE x.partition_id = p.id AND x.created_at < p.cutoff
          AND x.status = 'completed' AND x.completed_at < p.cutoff
        ORDER BY x.created_at LIMIT %(limit)s) m
    LIMIT %(limit)s
), locked AS (
    SELECT x.transaction_id FROM queen.messages x
    WHERE x.transaction_id = ANY (ARRAY(SELECT transaction_id FROM doomed)) AND x.status = 'completed'
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM queen.messages m USING locked
    WHERE m.transaction_id = locked.transaction_id
    RETURNING 1
)
SELECT count(*) FROM gone

-- maintenance_cleanup_partitions: remove empty partitions idle for idle_s seconds, at most limit --
SELECT queen.cleanup_partitions(%(idle_s)s, %(limit)s)

-- maintenance_fold_deltas: fold at most limit status deltas into partition_counts and metrics_minute --
SELECT queen.fold_deltas(%(limit)s)

-- maintenance_reconcile_counts: recount a few partitions after a cursor and correct count drift --
SELECT partition_id, drift FROM queen.reconcile_counts(%(after)s, %(limit)s, %(budget)s)

-- maintenance_grown_tables: hot tables now more than twice the size their planner statistics were taken at --
SELECT c.oid::regclass::text AS name
FROM pg_class c
WHERE c.oid = ANY (ARRAY['queen.messages', 'queen.partitions', 'queen.partition_heads',
                         'queen.queues']::regclass[])
  AND pg_relation_size(c.oid) / current_setting('block_size')::bigint
      > greatest(2 * c.relpages::bigint, 16)

-- maintenance_vacuum_candidates: Queen's tables holding many dead row versions that no vacuum has cleaned for a while, smallest first, and whether autovacuum runs at all --
SELECT s.schemaname || '.' || s.relname AS name, pg_table_size(s.relid) AS bytes,
       current_setting('autovacuum')::boolean AS autovacuum
FROM pg_stat_user_tables s
WHERE s.schemaname = 'queen'
  AND s.n_dead_tup > greatest(%(min_dead)s, %(dead_ratio)s * s.n_live_tup)
  AND coalesce(greatest(s.last_vacuum, s.last_autovacuum), '-infinity')
      < now() - make_interval(secs => %(quiet_s)s)
ORDER BY bytes

-- maintenance_prune_metrics: delete per-minute metrics older than the retention, at most limit rows --
WITH gone AS (
    DELETE FROM queen.metrics_minute m
    USING (SELECT minute, queue, partition FROM queen.metrics_minute
           WHERE minute < date_trunc('minute', now()) - make_interval(days => %(days)s)
           ORDER BY minute LIMIT %(limit)s) old
    WHERE m.minute = old.minute AND m.queue = old.queue AND m.partition = old.partition
    RETURNING 1
)
SELECT count(*) FROM gone

-- read_session: settings of an analytics or browsing read, for its transaction only: a short statement timeout, and no JIT (compiling costs more than these queries take) --
SELECT set_config('statement_timeout', %(ms)s, true), set_config('jit', 'off', true)

-- read_queues: the queues matching the filters (NULL: any) with their options, by name --
SELECT q.id, q.name, q.namespace, q.task, q.created_at,
       q.lease_time, q.retry_limit, q.priority, q.max_size, q.ttl, q.dlq_after_max_retries,
       q.delayed_processing, q.window_buffer, q.retention_seconds,
       q.completed_retention_seconds, q.retention_enabled, q.encryption_enabled,
       q.max_wait_time_seconds, q.retry_delay
FROM queen.queues q
WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s)
  AND (%(namespace)s::text IS NULL OR q.namespace = %(namespace)s)
  AND (%(task)s::text IS NULL OR q.task = %(task)s)
ORDER BY q.name

-- read_partitions: every partition of the queues matching the filters with its exact counts, by queue then name --
SELECT p.queue_id, p.id, p.name, p.created_at,
       s.pending, s.processing, s.completed, s.failed, s.dead_letter
FROM queen.queues q
JOIN queen.partitions p ON p.queue_id = q.id
JOIN queen.partition_stats s ON s.partition_id = p.id
WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s)
  AND (%(namespace)s::text IS NULL OR q.namespace = %(namespace)s)
  AND (%(task)s::text IS NULL OR q.task = %(task)s)
ORDER BY q.name, p.name

-- read_queue_totals: messages per status and partitions of every queue (partition-less ones too), by name --
SELECT q.name, count(p.id) AS partitions,
       coalesce(sum(s.pending), 0)::bigint AS pending,
       coalesce(sum(s.processing), 0)::bigint AS processing,
       coalesce(sum(s.completed), 0)::bigint AS completed,
       coalesce(sum(s.failed), 0)::bigint AS failed,
       coalesce(sum(s.dead_letter), 0)::bigint AS dead_letter
FROM queen.queues q
LEFT JOIN queen.partitions p ON p.queue_id = q.id
LEFT JOIN queen.partition_stats s ON s.partition_id = p.id
GROUP BY q.name
ORDER BY q.name

-- read_message_span: created_at of the oldest and newest message of each partition of a queue --
SELECT p.id AS partition_id,
       (SELECT m.created_at FROM queen.messages m WHERE m.partition_id = p.id
        ORDER BY m.created_at LIMIT 1) AS oldest,
       (SELECT m.created_at FROM queen.messages m WHERE m.partition_id = p.id
        ORDER BY m.created_at DESC LIMIT 1) AS newest
FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
WHERE q.name = %(queue)s

-- read_labels: queues, partitions and message counts per namespace or per task (label: 'namespace' | 'task'); unlabelled queues are left out --
SELECT CASE WHEN %(label)s = 'namespace' THEN q.namespace ELSE q.task END AS label,
       count(DISTINCT q.id) AS queues, count(p.id) AS partitions,
       coalesce(sum(s.pending), 0) AS pending, coalesce(sum(s.processing), 0) AS processing,
       coalesce(sum(s.completed), 0) AS completed, coalesce(sum(s.failed), 0) AS failed,
       coalesce(sum(s.dead_letter), 0) AS dead_letter
FROM queen.queues q
LEFT JOIN queen.partitions p ON p.queue_id = q.id
LEFT JOIN queen.partition_stats s ON s.partition_id = p.id
WHERE CASE WHEN %(label)s = 'namespace' THEN q.namespace ELSE q.task END IS NOT NULL
GROUP BY 1
ORDER BY 1

-- read_overview: numbers of queues, partitions, namespaces, tasks and messages per status --
SELECT (SELECT count(*) FROM queen.queues) AS queues,
       (SELECT count(*) FROM queen.partitions) AS partitions,
       (SELECT count(DISTINCT namespace) FROM queen.queues) AS namespaces,
       (SELECT count(DISTINCT task) FROM queen.queues) AS tasks,
       coalesce(sum(s.pending), 0) AS pending, coalesce(sum(s.processing), 0) AS processing,
       coalesce(sum(s.completed), 0) AS completed, coalesce(sum(s.failed), 0) AS failed,
       coalesce(sum(s.dead_letter), 0) AS dead_letter,
       now() AS at
FROM queen.partition_stats s

-- read_throughput: activity per minute over the last hour (60 rows, newest first, zero-filled) for the queues matching the filters, folded or not --
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - interval '59 minutes',
                           date_trunc('minute', now()), interval '1 minute') AS minute
), picked AS (
    SELECT q.name FROM queen.queues q
    WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s)
      AND (%(namespace)s::text IS NULL OR q.namespace = %(namespace)s)
      AND (%(task)s::text IS NULL OR q.task = %(task)s)
), activity AS (
    SELECT a.minute, a.incoming, a.popped, a.completed, a.failed, a.dead_letter, a.lag_ms
    FROM queen.metrics_minute a
    WHERE a.minute >= date_trunc('minute', now()) - interval '59 minutes'
      AND (%(any)s OR a.queue IN (SELECT name FROM picked))
    UNION ALL
    SELECT u.minute, u.incoming, u.popped, u.completed, u.failed, u.dead_letter, u.lag_ms
    FROM queen.metrics_minute_unfolded u
    WHERE u.minute >= date_trunc('minute', now()) - interval '59 minutes'
      AND (%(any)s OR u.queue IN (SELECT name FROM picked))
), per_minute AS (
    SELECT a.minute, sum(a.incoming) AS incoming, sum(a.popped) AS popped,
           sum(a.completed) AS completed, sum(a.failed) AS failed,
           sum(a.dead_letter) AS dead_letter, sum(a.lag_ms) AS lag_ms
    FROM activity a GROUP BY a.minute
)
SELECT m.minute, coalesce(a.incoming, 0)::bigint AS incoming,
       coalesce(a.popped, 0)::bigint AS popped,
       coalesce(a.completed, 0)::bigint AS completed,
       coalesce(a.failed, 0)::bigint AS failed,
       coalesce(a.dead_letter, 0)::bigint AS dead_letter,
       coalesce(a.lag_ms, 0)::bigint AS lag_ms
FROM minutes m LEFT JOIN per_minute a ON a.minute = m.minute
ORDER BY m.minute DESC

-- read_lag: backlog and processing times of the last 24 h per partition of the queues matching the filters --
SELECT queue, namespace, task, partition, pending, processing, completed, lag_ms, lag_hist
FROM queen.partition_lag(%(queue)s, %(namespace)s, %(task)s)

-- read_partition_ids: the partitions matching the message-list filters (NULL: any), how many messages they hold in the status asked for (NULL: any) and in all, and how many the index a newest-first walk would read holds overall --
WITH counted AS (
    SELECT s.partition_id,
           (%(queue)s::text IS NULL OR q.name = %(queue)s)
           AND (%(partition)s::text IS NULL OR p.name = %(partition)s)
           AND (%(namespace)s::text IS NULL OR q.namespace = %(namespace)s)
           AND (%(task)s::text IS NULL OR q.task = %(task)s) AS picked,
           CASE %(status)s::text WHEN 'pending' THEN s.pending WHEN 'processing' THEN s.processing
                WHEN 'completed' THEN s.completed WHEN 'failed' THEN s.failed
                WHEN 'dead_letter' THEN s.dead_letter
                ELSE s.pending + s.processing + s.completed + s.failed + s.dead_letter END AS n,
           CASE WHEN %(status)s::text IN ('failed', 'dead_letter') THEN s.failed + s.dead_letter
                ELSE s.pending + s.processing + s.completed + s.failed + s.dead_letter END AS walked,
           s.pending + s.processing + s.completed + s.failed + s.dead_letter AS total
    FROM queen.partition_stats s
    JOIN queen.partitions p ON p.id = s.partition_id
    JOIN queen.queues q ON q.id = p.queue_id
)
SELECT coalesce(array_agg(c.partition_id) FILTER (WHERE c.picked), '{}') AS ids,
       coalesce(sum(c.n) FILTER (WHERE c.picked), 0)::bigint AS matching,
       coalesce(sum(c.total) FILTER (WHERE c.picked), 0)::bigint AS held,
       coalesce(sum(c.walked), 0)::bigint AS walked
FROM counted c

-- read_messages: one page of messages, newest first, of some partitions (any: all of them) and optionally one status --
SELECT m.id, m.transaction_id, q.name AS queue, p.name AS partition, q.namespace, q.task,
       m.payload, m.encrypted, m.status, m.worker_id, m.created_at, m.locked_at,
       m.completed_at, m.failed_at, m.error_message, m.retry_count, m.lease_expires_at
FROM queen.messages m
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE (%(any)s OR m.partition_id = ANY (%(partitions)s::uuid[]))
  AND (%(status)s::text IS NULL OR m.status = %(status)s)
  AND (%(status)s::text IS NULL OR %(status)s::text NOT IN ('failed', 'dead_letter')
       OR m.is_failed)  -- lets a failed or dead_letter listing use messages_failed
ORDER BY m.created_at DESC, m.seq DESC
LIMIT %(limit)s OFFSET %(offset)s

-- read_messages_gathered: the same page as read_messages, by collecting every matching message of the partitions first (for filters that keep few messages: a newest-first walk would read far more); sorts keys only --
WITH hits AS MATERIALIZED (
    SELECT m.transaction_id, m.created_at, m.seq FROM queen.messages m
    WHERE m.partition_id = ANY (%(partitions)s::uuid[])
      AND (%(status)s::text IS NULL OR m.status = %(status)s)
      AND (%(status)s::text IS NULL OR %(status)s::text NOT IN ('failed', 'dead_letter')
           OR m.is_failed)  -- lets a failed or dead_letter listing use messages_failed
), page AS (
    SELECT h.* FROM hits h ORDER BY h.created_at DESC, h.seq DESC
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT m.id, m.transaction_id, q.name AS queue, p.name AS partition, q.namespace, q.task,
       m.payload, m.encrypted, m.status, m.worker_id, m.created_at, m.locked_at,
       m.completed_at, m.failed_at, m.error_message, m.retry_count, m.lease_expires_at
FROM page
JOIN queen.messages m ON m.transaction_id = page.transaction_id
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
ORDER BY page.created_at DESC, page.seq DESC

-- read_messages_merged: the same page as read_messages, from the newest `wanted` messages of each partition (its own index), merged; sorts keys only --
WITH page AS (
    SELECT x.transaction_id, x.created_at, x.seq
    FROM unnest(%(partitions)s::uuid[]) AS t(partition_id)
    CROSS JOIN LATERAL (
        SELECT m.transaction_id, m.created_at, m.seq FROM queen.messages m
        WHERE m.partition_id = t.partition_id
          AND (%(status)s::text IS NULL OR m.status = %(status)s)
          AND (%(status)s::text IS NULL OR %(status)s::text NOT IN ('failed', 'dead_letter')
               OR m.is_failed)  -- lets a failed or dead_letter listing use messages_failed
        ORDER BY m.created_at DESC, m.seq DESC
        LIMIT %(wanted)s
    ) x
    ORDER BY x.created_at DESC, x.seq DESC
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT m.id, m.transaction_id, q.name AS queue, p.name AS partition, q.namespace, q.task,
       m.payload, m.encrypted, m.status, m.worker_id, m.created_at, m.locked_at,
       m.completed_at, m.failed_at, m.error_message, m.retry_count, m.lease_expires_at
FROM page
JOIN queen.messages m ON m.transaction_id = page.transaction_id
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
ORDER BY page.created_at DESC, page.seq DESC

-- read_messages_of_partition: one page of messages of one partition, newest first, optionally one status (walks that partition's index) --
SELECT m.id, m.transaction_id, q.name AS queue, p.name AS partition, q.namespace, q.task,
       m.payload, m.encrypted, m.status, m.worker_id, m.created_at, m.locked_at,
       m.completed_at, m.failed_at, m.error_message, m.retry_count, m.lease_expires_at
FROM queen.messages m
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE m.partition_id = %(partition)s
  AND (%(status)s::text IS NULL OR m.status = %(status)s)
  AND (%(status)s::text IS NULL OR %(status)s::text NOT IN ('failed', 'dead_letter')
       OR m.is_failed)  -- lets a failed or dead_letter listing use messages_failed
ORDER BY m.created_at DESC, m.seq DESC
LIMIT %(limit)s OFFSET %(offset)s

-- read_message: one message with its queue's options --
SELECT m.id, m.transaction_id, q.name AS queue, p.name AS partition, q.namespace, q.task,
       m.payload, m.encrypted, m.status, m.worker_id, m.created_at, m.locked_at,
       m.completed_at, m.failed_at, m.error_message, m.retry_count, m.lease_expires_at,
       m.producer, q.lease_time, q.retry_limit, q.priority, q.max_size, q.ttl, q.dlq_after_max_retries,
       q.delayed_processing, q.window_buffer, q.retention_seconds,
       q.completed_retention_seconds, q.retention_enabled, q.encryption_enabled,
       q.max_wait_time_seconds, q.retry_delay
FROM queen.messages m
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE m.transaction_id = %(transaction_id)s

-- read_related: the messages of the same partition nearest in time (within 1 h either side) to one message; a first row with NULL related fields when it has none; no row when it does not exist --
WITH anchor AS (
    SELECT m.transaction_id, m.partition_id, m.created_at, m.seq
    FROM queen.messages m WHERE m.transaction_id = %(transaction_id)s
), near AS (
    SELECT r.* FROM anchor a CROSS JOIN LATERAL (
        SELECT x.transaction_id, x.id, x.status, x.created_at, x.seq, x.payload, x.encrypted
        FROM queen.messages x
        WHERE x.partition_id = a.partition_id AND x.transaction_id <> a.transaction_id
          AND x.created_at >= a.created_at - interval '1 hour' AND x.created_at <= a.created_at
        ORDER BY x.created_at DESC, x.seq DESC LIMIT %(limit)s) r
    UNION ALL
    SELECT r.* FROM anchor a CROSS JOIN LATERAL (
        SELECT x.transaction_id, x.id, x.status, x.created_at, x.seq, x.payload, x.encrypted
        FROM queen.messages x
        WHERE x.partition_id = a.partition_id AND x.transaction_id <> a.transaction_id
          AND x.created_at > a.created_at AND x.created_at <= a.created_at + interval '1 hour'
        ORDER BY x.created_at, x.seq LIMIT %(limit)s) r
), nearest AS (
    SELECT n.* FROM near n, anchor a
    ORDER BY abs(extract(epoch FROM n.created_at - a.created_at)), n.seq
    LIMIT %(limit)s
)
SELECT n.transaction_id, n.id, n.status, n.created_at, n.payload, n.encrypted
FROM anchor a LEFT JOIN nearest n ON true
ORDER BY n.created_at, n.seq

-- delete_message: delete one message; its former status, or NULL when there is no such message --
SELECT queen.delete_message(%(transaction_id)s) AS status

-- set_message_status: move one message from one of the statuses given to another; the status it had (NULL: no such message) --
SELECT queen.set_message_status(%(transaction_id)s, %(from)s::text[], %(to)s) AS status

-- clear_messages: delete the messages of a queue or of one of its partitions; NULL when it does not exist --
SELECT queen.clear_messages(%(queue)s, %(partition)s) AS cleared

-- token_create: store a new token's hash under its name; no row when the name is taken --
INSERT INTO queen.tokens (name, token_hash, role, queues, rate)
VALUES (%(name)s, %(token_hash)s, %(role)s, %(queues)s, %(rate)s)
ON CONFLICT (name) DO NOTHING
RETURNING name

-- token_find: the live token with this hash (no row: unknown or revoked) --
SELECT name, token_hash, role, queues, rate FROM queen.tokens
WHERE token_hash = %(token_hash)s AND revoked_at IS NULL

-- token_list: every token, live and revoked, by name --
SELECT name, role, queues, rate, created_at, revoked_at FROM queen.tokens ORDER BY name

-- token_revoke: revoke a live token by name; no row when there is none --
UPDATE queen.tokens SET revoked_at = now()
WHERE name = %(name)s AND revoked_at IS NULL
RETURNING name

-- extend_lease: move a live lease's expiry to now() + seconds (NULL: the queue's leaseTime); NULL when it is unknown, ended or expired --
SELECT queen.extend_lease(%(lease)s::uuid, %(seconds)s::integer) AS lease_expires_at

-- lease_queue: the queue of the partition a lease is on (no row: no such lease) --
SELECT q.name FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
WHERE p.lease_id = %(lease)s::uuid
