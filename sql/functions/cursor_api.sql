-- The cursor store as the HTTP API's hot path shows it: pushes and pops with the API's
-- message ids (queen.cursor_message_uuid), pops in the shape of queen.popped, and the
-- long-poll fallback.

-- The bigint id of a message from its API id (queen.cursor_message_uuid, cursor_reads.sql:
-- its low 62 bits, and above them the 12 bits after the version).
CREATE OR REPLACE FUNCTION queen.cursor_message_id(p_uuid uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (('x' || substr(replace(p_uuid::text, '-', ''), 14, 3))::bit(12)::bigint << 62)
           | (('x' || right(replace(p_uuid::text, '-', ''), 16))::bit(64)::bigint
              & 4611686018427387903)
$$;

-- Push for the API: queen.cursor_push with each message's API id. A duplicate's id is
-- the stored message's, looked up after the push (a statement of its own, so that it
-- sees what this push and those it waited for stored); a queued one was created now().
CREATE OR REPLACE FUNCTION queen.cursor_push_api(p_items jsonb, p_producer text DEFAULT NULL)
RETURNS TABLE (idx integer, message_id uuid, transaction_id text, status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    positions integer[];
    ids       bigint[];
    txids     text[];
    statuses  text[];
BEGIN
    SELECT array_agg(r.idx), array_agg(r.message_id), array_agg(r.transaction_id),
           array_agg(r.status)
    INTO positions, ids, txids, statuses
    FROM queen.cursor_push(p_items, p_producer) r;
    RETURN QUERY
    SELECT u.idx,
           CASE WHEN u.id IS NOT NULL THEN queen.cursor_message_uuid(u.id, CASE
               WHEN u.status = 'queued' THEN now()
               ELSE (SELECT m.created_at FROM queen.cursor_messages m
                     WHERE m.transaction_id = u.txid) END) END,
           u.txid, u.status
    FROM unnest(positions, ids, txids, statuses) u(idx, id, txid, status)
    ORDER BY u.idx;
END
$$;

-- Pop for the API, on any route (p_kind: partition / queue / filter), as a group; the
-- rows in the shape of queen.popped (the row store's), with the API id. p_prefer: for a
-- route by queue, a partition to try first (the one a wake-up named).
CREATE OR REPLACE FUNCTION queen.cursor_pop_api(
    p_kind text, p_queue text, p_partition text, p_namespace text, p_task text,
    p_group text, p_batch integer, p_worker text, p_mode text, p_from timestamptz,
    p_lease uuid, p_prefer text DEFAULT NULL)
RETURNS SETOF queen.popped
LANGUAGE plpgsql AS $$
DECLARE
    claimed queen.cursor_popped[];
BEGIN
    IF p_kind = 'filter' THEN
        claimed := ARRAY(SELECT d FROM queen.cursor_pop_filtered(
            p_namespace, p_task, p_group, p_batch, p_worker, p_mode, p_from, p_lease) d);
    ELSIF p_kind = 'partition' OR p_prefer IS NOT NULL THEN
        claimed := ARRAY(SELECT d FROM queen.cursor_pop_partition(
            p_queue, coalesce(p_partition, p_prefer), p_group, p_batch, p_worker, p_mode,
            p_from, p_lease) d);
    END IF;
    IF p_kind = 'queue' AND coalesce(cardinality(claimed), 0) = 0 THEN
        claimed := ARRAY(SELECT d FROM queen.cursor_pop_queue(
            p_queue, p_group, p_batch, p_worker, p_mode, p_from, p_lease) d);
    END IF;
    IF coalesce(cardinality(claimed), 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT queen.cursor_message_uuid(d.id, d.created_at), d.transaction_id, d.queue,
           d.partition, d.payload, d.encrypted, d.retry_count, q.priority, d.created_at,
           now(), d.lease_id, d.lease_expires_at, q.lease_time, q.retry_limit
    FROM unnest(claimed) WITH ORDINALITY d
    JOIN queen.queues q ON q.name = d.queue
    ORDER BY d.ordinality;
END
$$;

-- The long-poll fallback of the cursor store: wake payloads of partitions of the wanted
-- queues, queue/partition pairs and namespace/task filters (NULL matches anything) where
-- some group is free (no live lease, not held back) with a message past its cursor, or
-- where no group has a cursor yet and a message waits. A hint, like a notification:
-- the woken poll's group may find nothing. Walks every partition of the wanted queues.
CREATE OR REPLACE FUNCTION queen.cursor_ready_partitions(
    p_queues text[], p_partition_queues text[], p_partitions text[],
    p_namespaces text[], p_tasks text[], p_limit integer)
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    WITH wanted AS (
        SELECT p.id, queen.wake_payload(q.name, p.name, q.namespace, q.task) AS payload
        FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
        WHERE q.name = ANY (p_queues)
           OR EXISTS (SELECT 1 FROM unnest(p_namespaces, p_tasks) f(ns, tk)
                      WHERE (f.ns IS NULL OR f.ns = q.namespace)
                        AND (f.tk IS NULL OR f.tk = q.task))
           OR EXISTS (SELECT 1 FROM unnest(p_partition_queues, p_partitions) n(queue, partition)
                      WHERE n.queue = q.name AND n.partition = p.name)
    )
    SELECT w.payload FROM wanted w
    WHERE EXISTS (SELECT 1 FROM queen.cursor_consumers c
                  WHERE c.partition_id = w.id
                    AND (c.lease_id IS NULL OR c.lease_expires_at <= now())
                    AND (c.not_before IS NULL OR c.not_before <= now())
                    -- in key order, as queen.cursor_settle's probe (an EXISTS may scan)
                    AND (SELECT m.id FROM queen.cursor_messages m
                         WHERE m.partition_id = w.id AND m.id > c.cursor_id
                           AND m.id <> ALL (c.done_ids)
                         ORDER BY m.id LIMIT 1) IS NOT NULL)
       OR (NOT EXISTS (SELECT 1 FROM queen.cursor_consumers c WHERE c.partition_id = w.id)
           AND EXISTS (SELECT 1 FROM queen.cursor_messages m WHERE m.partition_id = w.id))
    LIMIT p_limit
$$;
