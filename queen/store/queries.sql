-- Runtime statements, by name. DDL and the functions they call live in sql/.

-- push: store the items of push bodies (a JSON array of {"items": [...]}, one per fused request), one row per item with its API id, numbered across the bodies, or one row of idx 0 with the ids' prefix and the ids when every item was stored with an id made of its message's (each item's answer made from it: Messages) --
-- A lone body's items are taken as they are: gathering them by path copies every item.
-- The API ids come as text, as answers carry them: no UUID object is made for each only to be written out again.
SELECT p.idx, p.message_id, p.transaction_id, p.status, p.ids
FROM (SELECT %(bodies)s::jsonb AS b) x
CROSS JOIN LATERAL queen.push_batch(
    CASE WHEN jsonb_array_length(x.b) = 1 THEN x.b -> 0 -> 'items'
         ELSE jsonb_path_query_array(x.b, '$[*].items[*]') END,
    %(producer)s, true) p

-- push_new: the common push in one statement: items naming no transactionId (the server sends no other) into existing partitions of queues without maxSize (bodies and producer as push's; queues and partitions: the names of the partitions they go to, each once; slots: each item's, in item order across the bodies, as a 1-based position in those), stored with ids drawn in item order under their partitions' push locks (queen.push_locks), none storing a transactionId (each's is made of its partition's id and its own: queen.made_txid); one row: fits (false: nothing was stored, the call goes to push), the API ids' prefix (queen.uuid_prefix), the ids in item order, the made transactionIds' prefixes (queen.made_prefix), one a slot, the API ids only when an id is 2^48 or more (the server makes the rest: Messages), and the wake-up payloads of the partitions (queen.wake_payload), one a partition, for the server to send once the push committed (queen.notify_wakes) --
-- Each name is found by a probe of its key (a LATERAL with a LIMIT, whatever the
-- statistics); the conditions are checked before the locks are taken, and the insert
-- runs only when all hold. An item's partition is its slot's (ROWS FROM: each item beside
-- its slot): no name is read out of an item and no item is joined to its partition; the
-- items are inserted as they come out of the bodies: a lone body's as they are, those of
-- several gathered into one array when the bodies are small, else read a body at a time
-- (queen.push_items; the other function of the two has no argument and gives no row).
-- Their ids are drawn in item order with no sort: the items' scan is the only source of
-- more than one row, joined to one-row sources with no join clause, so every plan keeps
-- its order (a sort copied each payload once more). No wake-up here: the server sends
-- the payloads once the push committed, made here from the queues' rows the push reads
-- anyway (queen.notify_sent would look the names up again).
WITH targets AS MATERIALIZED (  -- (generate_subscripts: an estimate the array leaves alone)
    SELECT n.k, n.queue, n.partition, q.max_size, q.namespace, q.task, p.id AS partition_id
    FROM (SELECT k, (%(queues)s::text[])[k] AS queue, (%(partitions)s::text[])[k] AS partition
          FROM generate_subscripts(%(queues)s::text[], 1) k) n
    LEFT JOIN LATERAL (SELECT q.id, q.max_size, q.namespace, q.task FROM queen.queues q
                       WHERE q.name = n.queue LIMIT 1) q ON true
    LEFT JOIN LATERAL (SELECT p.id FROM queen.partitions p
                       WHERE p.queue_id = q.id AND p.name = n.partition LIMIT 1) p ON true
), fit AS MATERIALIZED (  -- (evaluated in order: the locks only when the rest holds)
    SELECT NOT EXISTS (SELECT 1 FROM targets t
                       WHERE t.partition_id IS NULL OR t.max_size > 0)
           AND queen.push_locks(ARRAY(SELECT t.partition_id FROM targets t)) AS fits,
           ARRAY(SELECT t.partition_id FROM targets t ORDER BY t.k) AS parts,
           queen.uuid_prefix(now()) AS prefix
), stored AS (
    INSERT INTO queen.messages (partition_id, payload, encrypted, producer, trace_id)
    SELECT f.parts[x.slot], y.i -> 'payload',
           coalesce((y.i ->> 'encrypted')::boolean, false), %(producer)s, y.i ->> 'traceId'
    FROM fit f
    CROSS JOIN LATERAL (SELECT %(bodies)s::jsonb AS b) b
    CROSS JOIN LATERAL (SELECT jsonb_array_length(b.b) = 1
                               OR pg_column_size(b.b) < 1024 * jsonb_array_length(b.b)
                               AS gathered) g
    CROSS JOIN LATERAL ROWS FROM (  -- (each item beside its slot)
        jsonb_array_elements(
            CASE WHEN jsonb_array_length(b.b) = 1 THEN b.b -> 0 -> 'items'
                 WHEN g.gathered THEN jsonb_path_query_array(b.b, '$[*].items[*]') END),
        queen.push_items(CASE WHEN NOT g.gathered THEN b.b END),
        unnest(%(slots)s::integer[])) x(gathered, apart, slot)
    CROSS JOIN LATERAL (SELECT coalesce(x.gathered, x.apart) AS i) y
    WHERE f.fits
    RETURNING id
)
SELECT f.fits, f.prefix, a.ids,
       ARRAY(SELECT queen.made_prefix(p) FROM unnest(f.parts) WITH ORDINALITY u(p, k)
             ORDER BY u.k) AS made,
       CASE WHEN a.ids[cardinality(a.ids)] >= 281474976710656
            THEN (SELECT array_agg(queen.message_uuid_text(s.id, f.prefix, now()) ORDER BY s.id)
                  FROM stored s) END AS api_ids,
       ARRAY(SELECT queen.wake_payload(t.queue, t.partition, t.namespace, t.task, NULL)
             FROM targets t ORDER BY t.k) AS wakes
FROM fit f, (SELECT array_agg(s.id) AS ids FROM stored s) a  -- (as inserted: in id order)

-- pop_many: several pops in one call, each leasing a partition of its own (queen.pop_rows); rows: the pop's position and its messages, id the message's bigint id --
-- The API id is the server's to make (Messages: cheaper there than queen.message_uuid in SQL).
-- What the messages of one pop share (queue, partition, its id, priority, lockedAt, the lease, the options) comes on its first row only, NULL on the others: formatting and loading those nine values again on every row is a large share of what psycopg spends loading a row.
SELECT x.pop, x.id, x.transaction_id,
       CASE WHEN x.first THEN x.queue END AS queue,
       CASE WHEN x.first THEN x.partition END AS partition,
       x.payload, x.encrypted, x.retry_count,
       CASE WHEN x.first THEN x.priority END AS priority,
       x.created_at,
       CASE WHEN x.first THEN x.locked_at END AS locked_at,
       CASE WHEN x.first THEN x.lease_id END AS lease_id,
       CASE WHEN x.first THEN x.lease_expires_at END AS lease_expires_at,
       CASE WHEN x.first THEN x.lease_time END AS lease_time,
       CASE WHEN x.first THEN x.retry_limit END AS retry_limit,
       x.trace_id,
       CASE WHEN x.first THEN x.partition_id END AS partition_id
FROM (SELECT m.*, m.pop IS DISTINCT FROM lag(m.pop) OVER () AS first
      FROM queen.pop_rows(%(pops)s::jsonb) m) x

-- pop_one: a call of one pop, queen.pop itself (its route and options as parameters, as in an element of pop_many's array), with no second pass over its rows; rows as pop_many's, its position 1 --
-- The claim's commit does not wait for the disk, as pop_many's: the LATERAL call runs after the setting is made.
SELECT 1 AS pop, d.id, d.transaction_id,
       CASE WHEN d.first THEN d.queue END AS queue,
       CASE WHEN d.first THEN d.partition END AS partition,
       d.payload, d.encrypted, d.retry_count,
       CASE WHEN d.first THEN d.priority END AS priority,
       d.created_at,
       CASE WHEN d.first THEN now() END AS locked_at,
       CASE WHEN d.first THEN d.lease_id END AS lease_id,
       CASE WHEN d.first THEN d.lease_expires_at END AS lease_expires_at,
       CASE WHEN d.first THEN d.lease_time END AS lease_time,
       CASE WHEN d.first THEN d.retry_limit END AS retry_limit,
       d.trace_id,
       CASE WHEN d.first THEN d.partition_id END AS partition_id
FROM (SELECT p.*, p.ordinality = 1 AS first
      FROM (SELECT set_config('synchronous_commit', 'off', true) AS setting,
                   NULL::text AS none) s
      CROSS JOIN LATERAL queen.pop(
          %(kind)s::text, %(queue)s::text, %(partition)s::text, %(namespace)s::text,
          %(task)s::text, %(group)s::text, %(batch)s::integer, %(worker)s::text,
          %(mode)s::text, %(since)s::timestamptz, %(lease)s::uuid,
          coalesce(%(prefer)s::text, s.none)) WITH ORDINALITY p) d

-- notify_sent: wake long polls for pushes that committed, with the wake-ups acks collected (one transaction, asynchronous commit) --
SELECT queen.notify_sent(%(queues)s::text[], %(partitions)s::text[], %(wakes)s::text[])

-- notify_wakes: send the wake-ups that acks collected or push_new made, once they committed (as notify_sent) --
SELECT queen.notify_wakes(%(payloads)s::text[])

-- list_waiting_worker: list this worker as having parked polls, for the next seconds --
SELECT queen.list_waiting_worker(%(worker)s, %(seconds)s)

-- unclaim: give back a lease whose pop never reached its consumer (no attempt counted) --
SELECT queen.give_back(%(lease)s)

-- give_back_claim: give back a pop whose answer was lost with its connection; NULL: not yet --
SELECT queen.give_back_claim(%(lease)s, %(backend)s, %(server_started)s)

-- ready_partitions: wake payloads of partitions with work for the parked polls' routes --
SELECT payload FROM queen.ready_partitions(
    %(queues)s::text[], %(partition_queues)s::text[], %(partitions)s::text[],
    %(namespaces)s::text[], %(tasks)s::text[], %(limit)s) AS payload

-- ack_whole: the common ack, in one statement: each request naming one leaseId and completing every message of that live lease as popped (the transactionIds' digest) ends that lease and writes its completion, as queen.ack_whole_leases with queen.end_done_leases does, request by request (parameters as ack's, every status completed, each item naming its leaseId; lows and highs: the key range each leaseId names, lease_range); fit: the requests that did (1-based), their items all completed now; wakes: the wake-ups to send once committed (notify_wakes). The other requests go to ack, which decides them item by item --
-- Its commit does not wait for the disk, as queen.ack_items's. Each request's row is found
-- in the key range its leaseId names (a LATERAL with a LIMIT: never a join, which the
-- planner may make a scan of the table); its transactionIds are checked against the
-- lease's digest, not looked up, and its completion starts past the cursor (no message
-- lies between the cursor and a lease whole as popped). The row is updated by its ctid
-- (a TID scan), its checks in the UPDATE's own WHERE, so that a row another transaction
-- changed meanwhile is checked again as it now is. Its lookups call no SQL function (one
-- inlined is parsed again at each planning, and the range is the server's to compute).
-- generate_subscripts, not unnest: its row estimate does not depend on the array, so the
-- generic plan costs what custom ones do and is kept. While a worker has polls parked
-- (the only time a wake-up is sent), each ended row keeps the first message past its new
-- cursor (next_id, a probe of the key), which decides its wake-up and which a ranking of
-- the queue reads instead of probing again.
WITH a AS (
    SELECT %(txids)s::text[] AS txids, %(groups)s::text[] AS groups,
           %(statuses)s::text[] AS statuses, %(leases)s::text[] AS leases,
           %(sizes)s::integer[] AS sizes, %(per_request)s::boolean AS per_request,
           %(lows)s::uuid[] AS lows, %(highs)s::uuid[] AS highs
), s AS MATERIALIZED (  -- each request: its items' first and last positions
    SELECT a.txids, a.groups, a.leases, a.lows, a.highs, a.per_request, k, a.sizes[k] AS size,
           (sum(a.sizes[k]) OVER w - a.sizes[k] + 1)::integer AS first,
           (sum(a.sizes[k]) OVER w)::integer AS last
    FROM a CROSS JOIN LATERAL generate_subscripts(a.sizes, 1) k
    WHERE 'completed' = ALL (a.statuses)
    WINDOW w AS (ORDER BY k)
), r AS MATERIALIZED (  -- its pair, row, lease and digest
    SELECT s.k, s.size, f.part, f.first_id, f.row, g.grp, g.lease,
           hashtextextended(array_to_string(s.txids[s.first:s.last], E'\x1f'), 0) AS digest
    FROM s
    CROSS JOIN LATERAL (
        SELECT coalesce(s.groups[j.at], '__queue__') AS grp, s.leases[j.at]::uuid AS lease,
               s.lows[j.at] AS low, s.highs[j.at] AS high
        FROM (SELECT CASE WHEN s.per_request THEN s.k ELSE s.first END AS at) j) g
    CROSS JOIN LATERAL (SELECT c.partition_id AS part, c.cursor_id + 1 AS first_id,
                               c.ctid AS row
                        FROM queen.consumers c
                        WHERE c.partition_id BETWEEN g.low AND g.high
                          AND c.consumer_group = g.grp AND c.lease_id = g.lease
                        LIMIT 1) f
    WHERE s.per_request  -- (else one group and one leaseId for all of a request's items)
       OR ((s.groups IS NULL
            OR s.groups[s.first:s.last] = array_fill(s.groups[s.first], ARRAY[s.size]))
           AND s.leases[s.first:s.last] = array_fill(s.leases[s.first], ARRAY[s.size]))
), ended AS (
    UPDATE queen.consumers x SET
        cursor_id = greatest(x.cursor_id, x.lease_last_id), done_ids = '{}',
        lease_acked = '{}', lease_id = NULL, leased_by = NULL, lease_expires_at = NULL,
        lease_last_id = NULL, lease_size = NULL, lease_digest = NULL, updated_at = now(),
        next_after = CASE WHEN EXISTS (SELECT 1 FROM queen.waiting_workers w
                                         WHERE w.until > now())
                           THEN greatest(x.cursor_id, x.lease_last_id) END,
        next_id = CASE WHEN EXISTS (SELECT 1 FROM queen.waiting_workers w
                                      WHERE w.until > now())
                        THEN (SELECT m.id FROM queen.messages m
                              WHERE m.partition_id = x.partition_id
                                AND m.id > greatest(x.cursor_id, x.lease_last_id)
                              ORDER BY m.id LIMIT 1) END
    FROM r t
    WHERE x.ctid = ANY (ARRAY(SELECT t.row FROM r t))
      AND x.partition_id = t.part AND x.consumer_group = t.grp
      AND x.lease_id = t.lease AND x.lease_size = t.size
      AND x.lease_digest = t.digest AND t.first_id <= x.lease_last_id
      AND cardinality(x.lease_acked) = 0
      AND cardinality(x.done_ids) = 0 AND x.retried_max <= x.cursor_id
    RETURNING t.k, x.partition_id, x.consumer_group, x.cursor_id, t.first_id, t.size,
              x.next_id
), done AS (
    INSERT INTO queen.completions (partition_id, consumer_group, first_id, last_id, acked)
    SELECT e.partition_id, e.consumer_group, e.first_id, e.cursor_id, e.size
    FROM ended e ORDER BY 1, 2
)
SELECT (SELECT array_agg(e.k ORDER BY e.k) FROM ended e) AS fit,
       (SELECT array_agg(w) FROM ended e
        CROSS JOIN LATERAL queen.kept_wakes(e.partition_id, e.consumer_group, e.next_id) w)
         AS wakes,
       now() AS acknowledged_at
FROM (SELECT set_config('synchronous_commit', 'off', true)) setting

-- ack_lease: the most common ack, one request completing every message of the live lease it names, as popped (joined: its transactionIds joined by U+001F in delivery order; size: how many; lease: its leaseId; low and high: the key range it names, lease_range; grp: its consumer group, '__queue__' for queue mode): ends that lease and writes its completion, as ack_whole does (for a call of several requests, or without a leaseId); fit: {1} when it did, else empty (the request goes to ack); wakes: the wake-ups to send once committed (notify_wakes) --
-- One UPDATE of the group's consumer row that holds the lease (found as ack_whole finds
-- it), its checks in its WHERE as ack_whole's, its next message kept as ack_whole keeps
-- it: none of the steps per request that a call of several needs materialized (what that
-- saves: docs/PERFORMANCE.md).
WITH ended AS (
    UPDATE queen.consumers x SET
        cursor_id = greatest(x.cursor_id, x.lease_last_id), done_ids = '{}',
        lease_acked = '{}', lease_id = NULL, leased_by = NULL, lease_expires_at = NULL,
        lease_last_id = NULL, lease_size = NULL, lease_digest = NULL, updated_at = now(),
        next_after = CASE WHEN EXISTS (SELECT 1 FROM queen.waiting_workers w
                                         WHERE w.until > now())
                           THEN greatest(x.cursor_id, x.lease_last_id) END,
        next_id = CASE WHEN EXISTS (SELECT 1 FROM queen.waiting_workers w
                                      WHERE w.until > now())
                        THEN (SELECT m.id FROM queen.messages m
                              WHERE m.partition_id = x.partition_id
                                AND m.id > greatest(x.cursor_id, x.lease_last_id)
                              ORDER BY m.id LIMIT 1) END
    FROM (SELECT c.partition_id, c.cursor_id + 1 AS first_id FROM queen.consumers c
          WHERE c.partition_id BETWEEN %(low)s::uuid AND %(high)s::uuid
            AND c.consumer_group = %(grp)s::text AND c.lease_id = %(lease)s::uuid
          LIMIT 1) f
    WHERE x.partition_id = f.partition_id AND x.consumer_group = %(grp)s::text
      AND x.lease_id = %(lease)s::uuid
      AND x.lease_size = %(size)s::integer
      AND x.lease_digest = hashtextextended(%(joined)s::text, 0)
      AND f.first_id <= x.lease_last_id
      AND cardinality(x.lease_acked) = 0 AND cardinality(x.done_ids) = 0
      AND x.retried_max <= x.cursor_id
    RETURNING x.partition_id, x.consumer_group, x.cursor_id, f.first_id, x.next_id
), done AS (
    INSERT INTO queen.completions (partition_id, consumer_group, first_id, last_id, acked)
    SELECT e.partition_id, e.consumer_group, e.first_id, e.cursor_id, %(size)s::integer
    FROM ended e
)
SELECT ARRAY(SELECT 1 FROM ended) AS fit,
       (SELECT array_agg(w) FROM ended e
        CROSS JOIN LATERAL queen.kept_wakes(e.partition_id, e.consumer_group, e.next_id) w)
         AS wakes,
       now() AS acknowledged_at
FROM (SELECT set_config('synchronous_commit', 'off', true)) setting

-- ack: acknowledge a batch (its items as parallel arrays: ack_columns; sizes: how many are each request's; per_request: the arrays but the transactionIds hold one value a request), one row per acknowledgment in request order (reason: why it changed nothing), or one row of position 0 when every item completed a whole lease (each item's made from it: Messages); the first carries the wake-ups to send once committed (notify_wakes) --
SELECT idx, transaction_id, status, retry_count, acknowledged_at, reason, wakes
FROM queen.ack_items(%(txids)s::text[], %(groups)s::text[], %(statuses)s::text[],
                     %(errors)s::text[], %(leases)s::text[], %(sizes)s::integer[], true,
                     %(per_request)s::boolean)

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

-- queue_exists: whether a queue of this name exists --
SELECT EXISTS (SELECT 1 FROM queen.queues WHERE name = %(name)s)

-- group_subscribe: subscribe a group to a queue as its first pop would (a subscription already there is kept); whether it is new; no row when the queue does not exist --
SELECT NOT EXISTS (SELECT 1 FROM queen.consumer_groups g
                   WHERE g.queue_id = q.id AND g.consumer_group = %(group)s) AS created,
       queen.join_group(q.id, %(group)s, %(mode)s, %(since)s)
FROM queen.queues q WHERE q.name = %(queue)s

-- queue_flags: encryption flag and long-poll cap of every queue (cached per process) --
SELECT name, encryption_enabled, max_wait_time_seconds FROM queen.queues

-- ping: cheapest round trip, for health checks: whether this server takes writes --
SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'

-- transaction_statement_timeout: a call's own statement timeout (its transaction only): short for the dashboard, long for admin actions; its plans chosen for its values, off the hot path's one plan per session --
SELECT set_config('statement_timeout', %(ms)s, true), set_config('plan_cache_mode', 'auto', true)

-- dashboard_depths: current counts of every partition with its queue; queues without partitions too --
SELECT q.name AS queue, q.namespace, q.task, p.name AS partition,
       coalesce(s.pending, 0) AS pending, coalesce(s.processing, 0) AS processing,
       coalesce(s.completed, 0) AS completed, coalesce(s.failed, 0) AS failed,
       coalesce(s.dead_letter, 0) AS dead_letter
FROM queen.queues q
LEFT JOIN queen.partitions p ON p.queue_id = q.id
LEFT JOIN queen.message_counts(ARRAY(SELECT id FROM queen.partitions)) s
       ON s.partition_id = p.id
ORDER BY q.name, p.name

-- dashboard_recent: messages created and completed in the last complete minute (as maintenance counted them) --
SELECT coalesce(sum(incoming), 0)::bigint AS created, coalesce(sum(completed), 0)::bigint AS completed
FROM queen.metrics_minute
WHERE minute = date_trunc('minute', now()) - interval '1 minute'

-- dashboard_locate: queue and partition of messages named by transactionId --
SELECT u.txid AS transaction_id, q.name AS queue, p.name AS partition
FROM unnest(%(ids)s::text[]) u(txid)
CROSS JOIN LATERAL queen.named(u.txid) m
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id

-- dashboard_rates: activity per queue and minute over the last hour (minute NULL: a queue without any; queue NULL: every queue), what maintenance counted plus what lies past its watermarks --
WITH picked AS (
    SELECT p.id, q.name AS queue FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
    WHERE %(queue)s::text IS NULL OR q.name = %(queue)s
), activity AS (
    SELECT t.queue, a.minute, a.incoming, a.completed, a.failed, a.dead_letter
    FROM queen.metrics_minute a JOIN picked t ON t.id = a.partition_id
    WHERE a.minute >= date_trunc('minute', now()) - interval '59 minutes'
    UNION ALL
    SELECT t.queue, x.minute, x.incoming, x.completed, x.failed, x.dead_letter
    FROM picked t
    LEFT JOIN queen.partition_counts k ON k.partition_id = t.id
    LEFT JOIN queen.consumers c ON c.partition_id = t.id AND c.consumer_group = '__queue__'
    CROSS JOIN LATERAL queen.activity_walk(t.id, coalesce(k.counted_id, 0),
                                           coalesce(k.cursor_counted, 0),
                                           coalesce(c.cursor_id, 0), 5000) x
    WHERE x.minute >= date_trunc('minute', now()) - interval '59 minutes'
)
SELECT q.name AS queue, q.namespace, q.task, a.minute,
       coalesce(a.incoming, 0)::bigint AS incoming, coalesce(a.completed, 0)::bigint AS completed,
       coalesce(a.failed, 0)::bigint AS failed, coalesce(a.dead_letter, 0)::bigint AS dead_letter,
       now() AS at
FROM queen.queues q
LEFT JOIN (SELECT queue, minute, sum(incoming) AS incoming, sum(completed) AS completed,
                  sum(failed) AS failed, sum(dead_letter) AS dead_letter
           FROM activity GROUP BY queue, minute) a ON a.queue = q.name
WHERE %(queue)s::text IS NULL OR q.name = %(queue)s
ORDER BY q.name, a.minute

-- dashboard_leases: live leases, oldest first (queue NULL: of every queue); no index covers a lease column, so this reads the consumers of the queue (or all), as lease expiry does --
SELECT q.name AS queue, p.name AS partition, c.consumer_group, c.leased_by, c.lease_id,
       c.lease_size, cardinality(c.lease_acked) AS acked,
       least(c.updated_at, c.lease_expires_at - make_interval(secs => q.lease_time)) AS leased_at,
       c.lease_expires_at
FROM queen.consumers c
JOIN queen.queues q ON q.id = c.queue_id
JOIN queen.partitions p ON p.id = c.partition_id
WHERE c.lease_id IS NOT NULL AND c.lease_expires_at > now()
  AND (%(queue)s::text IS NULL OR q.name = %(queue)s)
ORDER BY leased_at, q.name, p.name
LIMIT %(limit)s

-- dashboard_connections: this database's sessions per application name (what pools hold, and how many are busy) --
SELECT coalesce(nullif(application_name, ''), '(none)') AS application,
       count(*) AS connections,
       count(*) FILTER (WHERE state IN ('active', 'idle in transaction')) AS busy,
       current_setting('max_connections')::integer AS max_connections
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
GROUP BY 1
ORDER BY 1

-- alert_put: create or replace one alert --
INSERT INTO queen.alerts (name, queue, kind, threshold, window_minutes)
VALUES (%(name)s, %(queue)s, %(kind)s, %(threshold)s, %(window_minutes)s)
ON CONFLICT (name) DO UPDATE
SET queue = excluded.queue, kind = excluded.kind, threshold = excluded.threshold,
    window_minutes = excluded.window_minutes

-- alert_delete: remove one alert (no row: it did not exist) --
DELETE FROM queen.alerts WHERE name = %(name)s RETURNING name

-- alert_values: every alert (at most 1000) with its queue's value now (NULL: no such queue): pending messages, age in seconds of the oldest pending one, or dead letters within the window --
SELECT a.name, a.queue, a.kind, a.threshold, a.window_minutes, a.created_at,
       CASE WHEN q.id IS NULL THEN NULL ELSE CASE a.kind
         WHEN 'depth' THEN
           (SELECT sum(s.pending)::double precision
            FROM queen.message_counts(ARRAY(SELECT p.id FROM queen.partitions p
                                            WHERE p.queue_id = q.id)) s)
         WHEN 'lag' THEN
           coalesce((SELECT extract(epoch FROM now() - min(o.created_at))::double precision
                     FROM queen.partitions p
                     LEFT JOIN queen.consumers c
                            ON c.partition_id = p.id AND c.consumer_group = '__queue__'
                     CROSS JOIN LATERAL (
                         SELECT m.created_at FROM queen.messages m
                         WHERE m.partition_id = p.id
                           AND m.id > CASE WHEN c.lease_id IS NOT NULL
                                                AND c.lease_expires_at > now()
                                           THEN greatest(c.cursor_id, c.lease_last_id)
                                           ELSE coalesce(c.cursor_id, 0) END
                           AND m.id <> ALL (coalesce(c.done_ids, '{}'))
                         ORDER BY m.id LIMIT 1) o
                     WHERE p.queue_id = q.id), 0)
         ELSE
           (SELECT count(*)::double precision FROM queen.failures f
            JOIN queen.partitions p ON p.id = f.partition_id
            WHERE p.queue_id = q.id AND f.status = 'dead_letter'
              AND f.status <> 'retry'
              AND f.failed_at > now() - make_interval(mins => a.window_minutes))
       END END AS value
FROM queen.alerts a
LEFT JOIN queen.queues q ON q.name = a.queue
ORDER BY a.name
LIMIT 1000

-- dashboard_notify: one dashboard batch or presence note to every worker's listener --
SELECT pg_notify(%(channel)s, %(payload)s)

-- maintenance_setup: session settings of the maintenance connection (timeouts, keepalives, no JIT) --
-- JIT only adds compile time to these short statements.
SELECT set_config('statement_timeout', %(statement_ms)s, false),
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

-- maintenance_expire_leases: end expired leases (retry, DLQ or failed), wake polls --
SELECT leases, messages, next_expiry_in FROM queen.expire(%(limit)s)

-- maintenance_wake_due: wake polls for partitions whose retryDelay ended or whose delayed/windowed messages became due --
SELECT woken, next_due_in, scanned_at FROM queen.wake_due(%(since)s)

-- maintenance_timed_queues: queues whose messages become poppable later (delayedProcessing, windowBuffer) --
SELECT name, delayed_processing, window_buffer FROM queen.queues
WHERE delayed_processing > 0 OR window_buffer > 0

-- maintenance_expire_ttl: dead-letter messages past their queue's ttl that nobody popped, at most limit --
SELECT queen.maintain_ttl(%(limit)s)

-- maintenance_cleanup_partitions: remove partitions without messages or live leases, idle for idle_s seconds, at most limit --
SELECT queen.cleanup_partitions(%(idle_s)s, %(limit)s)

-- maintenance_retention: delete messages past their queue's retention, at most limit --
SELECT queen.retention(%(limit)s)

-- maintenance_analyze: ANALYZE the message tables that changed by a tenth --
SELECT queen.analyze_tables(%(min_changes)s)

-- maintenance_refresh_counts: bring the count rows of some partitions up to date, a bounded step each, those that moved little since a refresh settle seconds ago left for later; how many are behind --
SELECT queen.count_refresh(%(partitions)s, %(step)s, %(settle)s, %(lag)s)

-- maintenance_vacuum_candidates: Queen's tables holding many dead row versions that no vacuum has cleaned for a while, and the few-row tables of names with rows added since their last vacuum; smallest first, and whether autovacuum runs at all --
-- (A pop reads a queue's partitions by an index alone, and a page of new rows is read
-- too until a vacuum marks it all-visible; autovacuum does not come for a few inserts.)
SELECT s.schemaname || '.' || s.relname AS name, pg_table_size(s.relid) AS bytes,
       current_setting('autovacuum')::boolean AS autovacuum
FROM pg_stat_user_tables s
WHERE s.schemaname = 'queen'
  AND (s.n_dead_tup > greatest(%(min_dead)s, %(dead_ratio)s * s.n_live_tup)
       OR (s.relname IN ('queues', 'partitions', 'consumer_groups')
           AND s.n_ins_since_vacuum > 0))
  AND coalesce(greatest(s.last_vacuum, s.last_autovacuum), '-infinity')
      < now() - make_interval(secs => %(quiet_s)s)
ORDER BY bytes

-- maintenance_prune_metrics: delete per-minute activity older than the retention, at most limit rows --
SELECT queen.metrics_prune(%(days)s, %(limit)s)

-- read_session: settings of an analytics or browsing read, for its transaction only: a short statement timeout, no JIT (compiling costs more than these queries take), and plans chosen for its values (off the hot path's one plan per session) --
SELECT set_config('statement_timeout', %(ms)s, true), set_config('jit', 'off', true),
       set_config('plan_cache_mode', 'auto', true)

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

-- read_partitions: every partition of the queues matching the filters with its counts, by queue then name --
WITH picked AS (
    SELECT p.queue_id, p.id, p.name, p.created_at, q.name AS queue
    FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s)
      AND (%(namespace)s::text IS NULL OR q.namespace = %(namespace)s)
      AND (%(task)s::text IS NULL OR q.task = %(task)s)
)
SELECT t.queue_id, t.id, t.name, t.created_at,
       s.pending, s.processing, s.completed, s.failed, s.dead_letter
FROM picked t
JOIN queen.message_counts(ARRAY(SELECT id FROM picked)) s ON s.partition_id = t.id
ORDER BY t.queue, t.name

-- read_queue_totals: messages per status and partitions of every queue (partition-less ones too), by name --
SELECT q.name, count(p.id) AS partitions,
       coalesce(sum(s.pending), 0)::bigint AS pending,
       coalesce(sum(s.processing), 0)::bigint AS processing,
       coalesce(sum(s.completed), 0)::bigint AS completed,
       coalesce(sum(s.failed), 0)::bigint AS failed,
       coalesce(sum(s.dead_letter), 0)::bigint AS dead_letter
FROM queen.queues q
LEFT JOIN queen.partitions p ON p.queue_id = q.id
LEFT JOIN queen.message_counts(ARRAY(SELECT id FROM queen.partitions)) s
       ON s.partition_id = p.id
GROUP BY q.name
ORDER BY q.name

-- read_message_span: created_at of the oldest and newest message of each partition of a queue (its first and last by id), and of its oldest pending one (past queue mode's cursor and live lease, not done) --
SELECT p.id AS partition_id,
       (SELECT m.created_at FROM queen.messages m WHERE m.partition_id = p.id
        ORDER BY m.id LIMIT 1) AS oldest,
       (SELECT m.created_at FROM queen.messages m WHERE m.partition_id = p.id
        ORDER BY m.id DESC LIMIT 1) AS newest,
       (SELECT m.created_at FROM queen.messages m
        WHERE m.partition_id = p.id
          AND m.id > CASE WHEN c.lease_id IS NOT NULL AND c.lease_expires_at > now()
                          THEN greatest(c.cursor_id, c.lease_last_id)
                          ELSE coalesce(c.cursor_id, 0) END
          AND m.id <> ALL (coalesce(c.done_ids, '{}'))
        ORDER BY m.id LIMIT 1) AS oldest_pending
FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = '__queue__'
WHERE q.name = %(queue)s

-- read_labels: queues, partitions and message counts per namespace or per task (label: 'namespace' | 'task'); unlabelled queues are left out --
SELECT CASE WHEN %(label)s = 'namespace' THEN q.namespace ELSE q.task END AS label,
       count(DISTINCT q.id) AS queues, count(p.id) AS partitions,
       coalesce(sum(s.pending), 0) AS pending, coalesce(sum(s.processing), 0) AS processing,
       coalesce(sum(s.completed), 0) AS completed, coalesce(sum(s.failed), 0) AS failed,
       coalesce(sum(s.dead_letter), 0) AS dead_letter
FROM queen.queues q
LEFT JOIN queen.partitions p ON p.queue_id = q.id
LEFT JOIN queen.message_counts(ARRAY(SELECT id FROM queen.partitions)) s
       ON s.partition_id = p.id
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
FROM queen.message_counts(ARRAY(SELECT id FROM queen.partitions)) s

-- read_throughput: activity per minute over the last hour (60 rows, newest first, zero-filled) for the queues matching the filters: what maintenance counted plus what lies past its watermarks; popped: deliveries that ended for good (completed, failed, dead-lettered) and those leased now, by the lease's start --
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - interval '59 minutes',
                           date_trunc('minute', now()), interval '1 minute') AS minute
), picked AS (
    SELECT p.id, q.lease_time FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
    WHERE %(any)s OR ((%(queue)s::text IS NULL OR q.name = %(queue)s)
                      AND (%(namespace)s::text IS NULL OR q.namespace = %(namespace)s)
                      AND (%(task)s::text IS NULL OR q.task = %(task)s))
), activity AS (
    SELECT a.minute, a.incoming, a.completed, a.failed, a.dead_letter, a.lag_ms, 0 AS leased
    FROM queen.metrics_minute a JOIN picked t ON t.id = a.partition_id
    WHERE a.minute >= date_trunc('minute', now()) - interval '59 minutes'
    UNION ALL
    SELECT x.minute, x.incoming, x.completed, x.failed, x.dead_letter, x.lag_ms, 0
    FROM picked t
    LEFT JOIN queen.partition_counts k ON k.partition_id = t.id
    LEFT JOIN queen.consumers c ON c.partition_id = t.id AND c.consumer_group = '__queue__'
    CROSS JOIN LATERAL queen.activity_walk(t.id, coalesce(k.counted_id, 0),
                                           coalesce(k.cursor_counted, 0),
                                           coalesce(c.cursor_id, 0), 5000) x
    UNION ALL
    SELECT date_trunc('minute', c.lease_expires_at - make_interval(secs => t.lease_time)),
           0, 0, 0, 0, 0, c.lease_size - cardinality(c.lease_acked)
    FROM picked t
    JOIN queen.consumers c ON c.partition_id = t.id AND c.consumer_group = '__queue__'
    WHERE c.lease_id IS NOT NULL AND c.lease_expires_at > now()
), per_minute AS (
    SELECT a.minute, sum(a.incoming) AS incoming, sum(a.completed) AS completed,
           sum(a.failed) AS failed, sum(a.dead_letter) AS dead_letter, sum(a.lag_ms) AS lag_ms,
           sum(a.leased) AS leased
    FROM activity a GROUP BY a.minute
)
SELECT m.minute, coalesce(a.incoming, 0)::bigint AS incoming,
       (coalesce(a.completed, 0) + coalesce(a.failed, 0) + coalesce(a.dead_letter, 0)
        + coalesce(a.leased, 0))::bigint AS popped,
       coalesce(a.completed, 0)::bigint AS completed,
       coalesce(a.failed, 0)::bigint AS failed,
       coalesce(a.dead_letter, 0)::bigint AS dead_letter,
       coalesce(a.lag_ms, 0)::bigint AS lag_ms
FROM minutes m LEFT JOIN per_minute a ON a.minute = m.minute
ORDER BY m.minute DESC

-- read_lag: backlog and processing times of the last 24 h per partition of the queues matching the filters (what maintenance counted plus what lies past its watermarks) --
WITH picked AS (
    SELECT q.name AS queue, q.namespace, q.task, p.id, p.name
    FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s)
      AND (%(namespace)s::text IS NULL OR q.namespace = %(namespace)s)
      AND (%(task)s::text IS NULL OR q.task = %(task)s)
)
SELECT t.queue, t.namespace, t.task, t.name AS partition, s.pending, s.processing,
       coalesce(w.completed, 0)::bigint AS completed, coalesce(w.lag_ms, 0)::bigint AS lag_ms,
       w.lag_hist
FROM picked t
JOIN queen.message_counts(ARRAY(SELECT id FROM picked)) s ON s.partition_id = t.id
LEFT JOIN queen.partition_counts k ON k.partition_id = t.id
LEFT JOIN queen.consumers c ON c.partition_id = t.id AND c.consumer_group = '__queue__'
LEFT JOIN LATERAL (
    SELECT sum(a.completed) AS completed, sum(a.lag_ms) AS lag_ms,
           queen.hist_sum(a.lag_hist) AS lag_hist
    FROM (SELECT r.completed, r.lag_ms, r.lag_hist FROM queen.metrics_minute r
          WHERE r.partition_id = t.id
            AND r.minute >= date_trunc('hour', now()) - interval '24 hours'
          UNION ALL
          SELECT x.completed, x.lag_ms, x.lag_hist
          FROM queen.activity_walk(t.id, coalesce(k.counted_id, 0),
                                   coalesce(k.cursor_counted, 0),
                                   coalesce(c.cursor_id, 0), 5000) x
          WHERE x.completed > 0) a
) w ON true
ORDER BY t.queue, t.name

-- read_page_partitions: the partitions matching the message-list filters (NULL: any) --
SELECT coalesce(array_agg(p.id), '{}') AS ids
FROM queen.partitions p
JOIN queen.queues q ON q.id = p.queue_id
WHERE (%(queue)s::text IS NULL OR q.name = %(queue)s)
  AND (%(partition)s::text IS NULL OR p.name = %(partition)s)
  AND (%(namespace)s::text IS NULL OR q.namespace = %(namespace)s)
  AND (%(task)s::text IS NULL OR q.task = %(task)s)

-- read_page: one page of messages of some partitions, newest first (by id), optionally in one status of queue mode --
WITH page AS (
    SELECT array_agg(x.partition_id ORDER BY x.id DESC) AS partitions,
           array_agg(x.id ORDER BY x.id DESC) AS ids
    FROM queen.message_page(%(partitions)s::uuid[], %(status)s, %(limit)s, %(offset)s) x
)
SELECT r.* FROM page CROSS JOIN LATERAL queen.message_rows(page.partitions, page.ids) r

-- read_message: one message with its queue's options --
SELECT r.*, q.lease_time, q.retry_limit, q.priority, q.max_size, q.ttl, q.dlq_after_max_retries,
       q.delayed_processing, q.window_buffer, q.retention_seconds,
       q.completed_retention_seconds, q.retention_enabled, q.encryption_enabled,
       q.max_wait_time_seconds, q.retry_delay
FROM queen.named(%(transaction_id)s) m
CROSS JOIN LATERAL queen.message_rows(ARRAY[m.partition_id], ARRAY[m.id]) r
JOIN queen.queues q ON q.name = r.queue

-- read_related: the messages of the same partition nearest in time (within 1 h either side) to one message; a first row with NULL related fields when it has none; no row when it does not exist --
WITH near AS (
    SELECT array_agg(x.partition_id ORDER BY x.n) FILTER (WHERE x.id IS NOT NULL) AS partitions,
           array_agg(x.id ORDER BY x.n) FILTER (WHERE x.id IS NOT NULL) AS ids,
           count(*) AS found
    FROM queen.related_messages(%(transaction_id)s, %(limit)s) WITH ORDINALITY x(partition_id, id, n)
)
SELECT r.transaction_id, r.id, r.status, r.created_at, r.payload, r.encrypted
FROM near LEFT JOIN LATERAL queen.message_rows(near.partitions, near.ids) r ON true
WHERE near.found > 0

-- delete_message: delete one message; queue mode's status it had, or NULL when there is no such message --
SELECT queen.delete_message(%(transaction_id)s) AS status

-- retry_message: write a failed or dead-lettered message again for queue mode; the status it had (NULL: no such message) --
SELECT queen.retry_message(%(transaction_id)s) AS status

-- dead_letter_message: move a pending or failed message to the dead letter queue; the status it had (NULL: no such message) --
SELECT queen.dead_letter_message(%(transaction_id)s) AS status

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

-- extend_leases: extend live leases, each by its seconds (NULL: its queue's leaseTime); one row per lease in order, NULL when it has ended --
SELECT x.ord, queen.extend_lease(x.lease, x.seconds)
FROM unnest(%(leases)s::uuid[], %(seconds)s::integer[]) WITH ORDINALITY x(lease, seconds, ord)
ORDER BY x.ord

-- lease_queue: the queue a live lease is on --
SELECT queen.lease_queue(%(lease)s)

-- delete_queue: delete a queue with its messages, partitions and groups; the number of messages deleted, NULL when it does not exist --
SELECT queen.delete_queue(%(queue)s) AS deleted

-- read_dead_letter_count: how many messages are dead-lettered, of a queue (NULL: any) and group (NULL: any, queue mode included) --
SELECT count(*) AS total
FROM queen.failures f
JOIN queen.partitions p ON p.id = f.partition_id
JOIN queen.queues q ON q.id = p.queue_id
WHERE f.status = 'dead_letter'
  AND (%(queue)s::text IS NULL OR q.name = %(queue)s)
  AND (%(group)s::text IS NULL OR f.consumer_group = %(group)s)

-- read_dead_letters: one page of dead-lettered messages, most recently dead-lettered first, with their group, error and retries --
SELECT queen.message_uuid(m.id, m.created_at) AS id,
       queen.txid(m.transaction_id, m.partition_id, m.id) AS transaction_id, q.name AS queue,
       p.name AS partition, p.id AS partition_id, f.consumer_group, m.payload, m.encrypted,
       f.error, f.retry_count, f.failed_at, m.created_at
FROM queen.failures f
JOIN queen.partitions p ON p.id = f.partition_id
JOIN queen.queues q ON q.id = p.queue_id
JOIN queen.messages m ON m.partition_id = f.partition_id AND m.id = f.message_id
WHERE f.status = 'dead_letter'
  AND (%(queue)s::text IS NULL OR q.name = %(queue)s)
  AND (%(group)s::text IS NULL OR f.consumer_group = %(group)s)
ORDER BY f.failed_at DESC, f.partition_id, f.message_id DESC
LIMIT %(limit)s OFFSET %(offset)s
