-- Push: immutable messages, ids in commit order within a partition.

-- The key of a partition's push lock: held by a push from before it draws ids until it
-- commits, so the ids of a partition commit in order (see queen.messages).
CREATE OR REPLACE FUNCTION queen.push_lock_key(p_partition uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(p_partition::text, 23)
$$;

-- The items of push bodies (a JSON array of {"items": [...]}, one per fused request), in
-- order, a body at a time: for bodies of some size, where gathering every item into one
-- array (a path query) copies each item into a new document first. (A statement a body
-- costs more than that copy when the bodies are small: the server's push gathers those.)
CREATE OR REPLACE FUNCTION queen.push_items(p_bodies jsonb) RETURNS SETOF jsonb
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    FOR k IN 0 .. jsonb_array_length(p_bodies) - 1 LOOP
        RETURN QUERY SELECT jsonb_array_elements(p_bodies -> k -> 'items');
    END LOOP;
END
$$;

-- The partitions a push writes to, in (queue, partition) order, with their push locks
-- (queen.push_lock_key) taken in that order: created as needed (partition
-- 'Default' when none is named). A partition stays while its lock is held: its removal
-- (queen.cleanup_partitions) takes the same lock, and one removed between the
-- lookup and the lock is made again. One probe of the unique indexes per name, whatever
-- the statistics. (A row lock on each partition, which would do the same, writes WAL and
-- slows a push of one message markedly.)
CREATE OR REPLACE FUNCTION queen.push_targets(p_items jsonb) RETURNS queen.push_target[]
LANGUAGE plpgsql AS $$
DECLARE
    names   queen.push_target[];
    targets queen.push_target[];
BEGIN
    SELECT array_agg(ROW(n.queue, n.partition, NULL, NULL)::queen.push_target
                     ORDER BY n.queue, n.partition)
    INTO names
    FROM (SELECT DISTINCT i ->> 'queue' AS queue, coalesce(i ->> 'partition', queen.default_partition()) AS partition
          FROM jsonb_array_elements(p_items) i) n;
    LOOP
        SELECT array_agg(ROW(n.queue, n.partition, p.id, q.id)::queen.push_target)
        INTO targets
        FROM unnest(names) n
        CROSS JOIN LATERAL (SELECT q.id FROM queen.queues q WHERE q.name = n.queue LIMIT 1) q
        CROSS JOIN LATERAL (SELECT p.id FROM queen.partitions p
                            WHERE p.queue_id = q.id AND p.name = n.partition) p;
        IF cardinality(targets) = cardinality(names) THEN
            IF queen.push_locks(ARRAY(SELECT t.partition_id FROM unnest(targets) t)) THEN
                RETURN targets;
            END IF;
        END IF;
        INSERT INTO queen.queues (name)
        SELECT DISTINCT n.queue FROM unnest(names) n ORDER BY 1
        ON CONFLICT (name) DO NOTHING;
        INSERT INTO queen.partitions (queue_id, name)
        SELECT q.id, n.partition FROM unnest(names) n JOIN queen.queues q ON q.name = n.queue
        ORDER BY 1, 2
        ON CONFLICT (queue_id, name) DO NOTHING;
    END LOOP;
END
$$;

-- Take the push locks of partitions p_partitions (queen.push_lock_key), in order:
-- whether all of them are still there once locked (a statement of its own, so it sees a
-- removal committed while it waited: queen.cleanup_partitions takes the same locks).
-- queen.push_targets takes them so for the partitions it found, and the server's push of
-- items without transactionIds (query push_new) from its one statement.
CREATE OR REPLACE FUNCTION queen.push_locks(p_partitions uuid[]) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(queen.push_lock_key(x))
    FROM unnest(p_partitions) x ORDER BY x;
    RETURN (SELECT count(*) FROM queen.partitions p WHERE p.id = ANY (p_partitions))
           = cardinality(p_partitions);
END
$$;

-- Messages of a queue pending for queue mode (not consumed, not under its live lease:
-- maxSize caps pending messages), counted up to p_cap.
CREATE OR REPLACE FUNCTION queen.pending_count(p_queue uuid, p_cap integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer FROM (
        SELECT 1 FROM queen.partitions p
        LEFT JOIN queen.consumers c
               ON c.partition_id = p.id AND c.consumer_group = '__queue__'
        JOIN queen.messages m
          ON m.partition_id = p.id AND m.id > coalesce(c.cursor_id, 0)
             AND m.id <> ALL (coalesce(c.done_ids, '{}'))
        WHERE p.queue_id = p_queue
          AND NOT coalesce(c.lease_expires_at > now() AND m.id <= c.lease_last_id
                           AND m.id <> ALL (c.lease_acked), false)
        LIMIT p_cap) pending
$$;

-- maxSize: the positions of the items past a queue's room (pushes to a limited queue
-- are serialised on the queue, so each counts what the one before stored).
CREATE OR REPLACE FUNCTION queen.push_rejected(p_items jsonb, p_targets queen.push_target[])
RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    limited  record;
    rejected integer[] := '{}';
BEGIN
    FOR limited IN
        SELECT q.id, q.max_size
        FROM (SELECT DISTINCT t.queue_id FROM unnest(p_targets) t) t
        JOIN queen.queues q ON q.id = t.queue_id
        WHERE q.max_size > 0
        ORDER BY q.id
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(limited.id::text, 13));
        rejected := rejected || ARRAY(
            SELECT x.ord::integer
            FROM jsonb_array_elements(p_items) WITH ORDINALITY x(i, ord)
            JOIN unnest(p_targets) t ON t.queue = x.i ->> 'queue'
                                    AND t.partition = coalesce(x.i ->> 'partition', queen.default_partition())
            WHERE t.queue_id = limited.id
            ORDER BY x.ord
            OFFSET greatest(0, limited.max_size
                               - queen.pending_count(limited.id, limited.max_size)));
    END LOOP;
    RETURN rejected;
END
$$;

-- (Earlier builds of these two took the API ids' prefix: an item naming no transactionId
-- was stored with its API id as its transactionId.)
DROP FUNCTION IF EXISTS queen.number_messages(jsonb, queen.push_target[], integer[], text);
DROP FUNCTION IF EXISTS queen.store_messages(jsonb, text, text);
-- The accepted items with their ids, drawn in item order (the caller holds the push
-- locks of their partitions); an item naming no transactionId gets none stored (its own
-- is made of its ids: queen.made_txid). (PL/pgSQL, not SQL: PostgreSQL plans a SQL
-- function's statement again at every call it cannot inline; PL/pgSQL keeps the plan for
-- the session.)
CREATE OR REPLACE FUNCTION queen.number_messages(p_items jsonb, p_targets queen.push_target[],
                                                 p_rejected integer[])
RETURNS queen.push_item[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN (
    SELECT coalesce(array_agg(ROW(n.idx, n.id, n.i ->> 'transactionId',
                                  n.partition_id, n.queue_id, n.i -> 'payload',
                                  coalesce((n.i ->> 'encrypted')::boolean, false),
                                  n.i ->> 'traceId')::queen.push_item ORDER BY n.idx), '{}')
    FROM (SELECT r.*, nextval('queen.messages_id_seq'::regclass) AS id
          FROM (SELECT x.ord::integer AS idx, x.i, t.partition_id, t.queue_id
                FROM jsonb_array_elements(p_items) WITH ORDINALITY x(i, ord)
                JOIN unnest(p_targets) t ON t.queue = x.i ->> 'queue'
                                        AND t.partition = coalesce(x.i ->> 'partition', queen.default_partition())
                WHERE x.ord <> ALL (p_rejected)
                ORDER BY x.ord) r) n);
END
$$;

-- A client's transactionIds of the form Queen makes (queen.made_form) must each name a
-- stored message, whose duplicates they are; any other is refused (invalid_parameter_value,
-- nothing stored), so a client's own never equals one made later.
CREATE OR REPLACE FUNCTION queen.check_made_txids(p_items jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    unknown text;
BEGIN
    SELECT x.i ->> 'transactionId' INTO unknown
    FROM jsonb_array_elements(p_items) x(i)
    WHERE queen.made_form(x.i ->> 'transactionId')
      AND NOT EXISTS (SELECT 1 FROM queen.named(x.i ->> 'transactionId'))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('transactionId %s has the form of those Queen makes and names no'
                             ' stored message', unknown);
    END IF;
END
$$;

-- Store a batch (the body's "items" array): its partitions locked (queen.push_targets),
-- maxSize applied (rejected: the positions past a queue's room), ids drawn (accepted, in
-- item order) and the messages inserted in transactionId order, so that pushes sharing
-- ids wait for each other and never deadlock (stored: the ids that were not duplicates).
-- One wake-up per queue, sent at commit, while polls are parked; none from a session
-- with queen.push_notify = 'after_commit' (Queen's own pool), which sends them itself
-- once the push committed (queen.notify_pushed: see there why). An item naming a
-- transactionId of the form Queen makes (queen.check_made_txids) is a duplicate.
CREATE OR REPLACE FUNCTION queen.store_messages(p_items jsonb, p_producer text,
                                                OUT accepted queen.push_item[],
                                                OUT stored bigint[], OUT rejected integer[])
LANGUAGE plpgsql AS $$
DECLARE
    targets queen.push_target[];
BEGIN
    PERFORM queen.check_made_txids(p_items);
    targets := queen.push_targets(p_items);
    rejected := '{}';
    IF EXISTS (SELECT 1 FROM unnest(targets) t JOIN queen.queues q ON q.id = t.queue_id
               WHERE q.max_size > 0) THEN
        rejected := queen.push_rejected(p_items, targets);
    END IF;
    accepted := queen.number_messages(p_items, targets, rejected);
    WITH inserted AS (
        INSERT INTO queen.messages
            (id, partition_id, transaction_id, payload, encrypted, producer, trace_id)
        OVERRIDING SYSTEM VALUE
        SELECT a.id, a.partition_id, a.transaction_id, a.payload, a.encrypted, p_producer, a.trace_id
        FROM unnest(accepted) a
        WHERE NOT coalesce(queen.made_form(a.transaction_id), false)
        ORDER BY a.transaction_id COLLATE "C", a.idx
        ON CONFLICT (transaction_id) WHERE transaction_id IS NOT NULL DO NOTHING
        RETURNING id
    )
    SELECT coalesce(array_agg(i.id), '{}') INTO stored FROM inserted i;
    IF current_setting('queen.push_notify', true) IS DISTINCT FROM 'after_commit' THEN
        PERFORM queen.wake(ARRAY(SELECT DISTINCT a.partition_id FROM unnest(accepted) a
                                 WHERE a.id = ANY (stored)));
    END IF;
END
$$;

-- (An earlier build took the API ids' prefix and stored each message's API id as its
-- transactionId.)
DROP FUNCTION IF EXISTS queen.store_new_messages(jsonb, queen.push_target[], text, text);
-- Store a batch none of whose items names a transactionId, into queues without maxSize
-- (the caller holds the push locks of targets, queen.push_targets): every item is
-- stored, with an id drawn in item order and no transactionId (its own is made of its
-- ids: queen.made_txid). Returns the ids in item order. Nothing can conflict, so the
-- insert is a plain one, not a speculative one (ON CONFLICT writes a second WAL record
-- per row to confirm it), and nothing passes through arrays of rows.
CREATE OR REPLACE FUNCTION queen.store_new_messages(p_items jsonb, p_targets queen.push_target[],
                                                    p_producer text)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
BEGIN
    WITH stored AS (
        INSERT INTO queen.messages
            (id, partition_id, payload, encrypted, producer, trace_id)
        OVERRIDING SYSTEM VALUE
        SELECT n.id, n.partition_id,
               n.i -> 'payload', coalesce((n.i ->> 'encrypted')::boolean, false), p_producer,
               n.i ->> 'traceId'
        FROM (SELECT r.*, nextval('queen.messages_id_seq'::regclass) AS id
              FROM (SELECT x.ord, x.i, t.partition_id
                    FROM jsonb_array_elements(p_items) WITH ORDINALITY x(i, ord)
                    JOIN unnest(p_targets) t
                      ON t.queue = x.i ->> 'queue'
                     AND t.partition = coalesce(x.i ->> 'partition', queen.default_partition())
                    ORDER BY x.ord) r) n
        RETURNING id
    )
    SELECT array_agg(s.id ORDER BY s.id) INTO ids FROM stored s;
    IF current_setting('queen.push_notify', true) IS DISTINCT FROM 'after_commit' THEN
        PERFORM queen.wake(ARRAY(SELECT DISTINCT t.partition_id FROM unnest(p_targets) t));
    END IF;
    RETURN ids;
END
$$;

-- Push a batch in one call: queued / duplicate (its transactionId names a stored message,
-- or one earlier in the batch) / rejected (maxSize), one row per item in item order, with the
-- message's API id (a queued one was created now(); a duplicate's is the stored
-- message's, looked up after the insert, in a statement that sees what this push and
-- those it waited for stored). A batch naming no transactionId into queues without
-- maxSize (the common push) is stored by queen.store_new_messages; any other by
-- queen.store_messages. Its statements and those of the functions it calls keep one plan
-- per session (plan_cache_mode): a custom plan, made afresh at every call, always looks
-- cheaper with the batch's arrays known, and re-planning is a large share of the
-- database CPU of one-message pushes under load. The same holds for the other entry
-- points of the hot path (pop, ack, lease extension, wake-ups);
-- tests/integration/test_query_plans.py checks that their plans are generic. The API
-- ids come as text. p_compact (the server's push): a batch stored whole by
-- queen.store_new_messages into one partition answers one row instead of one an item:
-- idx 0, message_id the API ids' prefix (queen.uuid_prefix), transaction_id the made
-- transactionIds' (queen.made_prefix) and ids the messages' ids in item order, from
-- which the server makes each item's answer.
CREATE OR REPLACE FUNCTION queen.push_batch(p_items jsonb, p_producer text,
                                            p_compact boolean)
RETURNS TABLE (idx integer, message_id text, transaction_id text, status text,
               ids bigint[])
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    s       record;
    targets queen.push_target[];
    ids     bigint[];
    prefix  text := queen.uuid_prefix(now());
BEGIN
    IF jsonb_array_length(p_items) = 0 THEN
        RETURN;
    END IF;
    IF NOT jsonb_path_exists(p_items, '$[*].transactionId') THEN
        targets := queen.push_targets(p_items);
        IF NOT EXISTS (SELECT 1 FROM unnest(targets) t JOIN queen.queues q ON q.id = t.queue_id
                       WHERE q.max_size > 0) THEN
            ids := queen.store_new_messages(p_items, targets, p_producer);
            IF p_compact AND cardinality(targets) = 1 AND 281474976710656 > ALL (ids) THEN
                RETURN QUERY SELECT 0, prefix, queen.made_prefix(targets[1].partition_id),
                                    'queued', ids;
                RETURN;  -- (each id below 2^48: its API id is the prefix and its hex)
            END IF;
            RETURN QUERY
            SELECT k.n::integer, queen.message_uuid_text(k.id, prefix, now()),
                   queen.made_txid(t.partition_id, k.id), 'queued', NULL::bigint[]
            FROM unnest(ids) WITH ORDINALITY k(id, n)
            JOIN (SELECT x.ord, t.partition_id
                  FROM jsonb_array_elements(p_items) WITH ORDINALITY x(i, ord)
                  JOIN unnest(targets) t
                    ON t.queue = x.i ->> 'queue'
                   AND t.partition = coalesce(x.i ->> 'partition', queen.default_partition())) t
              ON t.ord = k.n
            ORDER BY k.n;
            RETURN;
        END IF;
    END IF;
    s := queen.store_messages(p_items, p_producer);
    IF cardinality(s.stored) = cardinality(s.accepted) THEN
        -- Every item stored (the common case): nothing to look up.
        RETURN QUERY
        SELECT a.idx, queen.message_uuid_text(a.id, prefix, now()),
               queen.txid(a.transaction_id, a.partition_id, a.id), 'queued', NULL::bigint[]
        FROM unnest(s.accepted) a
        UNION ALL
        SELECT r, NULL, NULL, 'rejected', NULL FROM unnest(s.rejected) r
        ORDER BY 1;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT a.idx,
           CASE WHEN a.id = ANY (s.stored)
                THEN queen.message_uuid_text(a.id, prefix, now())
                ELSE m.uuid END,
           queen.txid(a.transaction_id, a.partition_id, a.id),
           CASE WHEN a.id = ANY (s.stored) THEN 'queued' ELSE 'duplicate' END,
           NULL::bigint[]
    FROM unnest(s.accepted) a
    LEFT JOIN LATERAL (SELECT queen.message_uuid(m.id, m.created_at)::text AS uuid
                       FROM queen.named(a.transaction_id) n
                       JOIN queen.messages m ON m.partition_id = n.partition_id AND m.id = n.id
                       WHERE NOT a.id = ANY (s.stored)
                       LIMIT 1) m ON true
    UNION ALL
    SELECT r, NULL, NULL, 'rejected', NULL FROM unnest(s.rejected) r
    ORDER BY 1;
END
$$;

-- A batch pushed (queen.push_batch, one row an item), the API ids as uuid: the SQL
-- entry point of transactional enqueue (README.md), and the in-process lifecycle's.
CREATE OR REPLACE FUNCTION queen.push(p_items jsonb, p_producer text DEFAULT NULL)
RETURNS TABLE (idx integer, message_id uuid, transaction_id text, status text)
LANGUAGE plpgsql AS $$  -- (a SQL function's statement would be planned at each call)
BEGIN
    RETURN QUERY SELECT p.idx, p.message_id::uuid, p.transaction_id, p.status
                 FROM queen.push_batch(p_items, p_producer, false) p;
END
$$;

-- queen.push with the messages' bigint ids (queen.message_id_of of the API
-- ids), for callers working on the tables themselves.
CREATE OR REPLACE FUNCTION queen.push_rows(p_items jsonb, p_producer text DEFAULT NULL)
RETURNS TABLE (idx integer, message_id bigint, transaction_id text, status text)
LANGUAGE sql AS $$
    SELECT p.idx, queen.message_id_of(p.message_id), p.transaction_id, p.status
    FROM queen.push(p_items, p_producer) p
    ORDER BY p.idx
$$;
