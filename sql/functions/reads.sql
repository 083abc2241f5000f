-- Reads: derived statuses, counts, pages and related messages. Statuses are queue mode's
-- ('__queue__'), derived as docs/STORAGE.md says.

-- Queue mode's status of message p_id given its partition's consumer row c (NULL: never
-- popped) and its failure record's status (NULL: none).
CREATE OR REPLACE FUNCTION queen.message_status(p_id bigint, c queen.consumers,
                                                p_failure text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_failure IN ('dead_letter', 'failed') THEN p_failure
        WHEN c.partition_id IS NULL THEN 'pending'
        WHEN p_id <= c.cursor_id OR p_id = ANY (c.done_ids) THEN 'completed'
        WHEN c.lease_id IS NOT NULL AND c.lease_expires_at > now() AND p_id <= c.lease_last_id
             AND p_id <> ALL (c.lease_acked) THEN 'processing'
        ELSE 'pending' END
$$;

-- Messages of a partition with p_after < id <= p_upto, counted up to p_cap (one walk of
-- the primary key).
CREATE OR REPLACE FUNCTION queen.count_range(p_partition uuid, p_after bigint,
                                             p_upto bigint, p_cap integer)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM (SELECT 1 FROM queen.messages m
                          WHERE m.partition_id = p_partition AND m.id > p_after
                            AND m.id <= p_upto
                          ORDER BY m.id LIMIT p_cap) x
$$;

-- Queue mode's counts of partitions: the rollup (queen.partition_counts) plus what lies past
-- its watermarks, each walk capped at p_cap messages (past that a count is short until
-- maintenance catches up). pending + processing + completed + failed + dead_letter is
-- the number of messages.
CREATE OR REPLACE FUNCTION queen.message_counts(p_partitions uuid[],
                                                p_cap integer DEFAULT 100000)
RETURNS TABLE (partition_id uuid, pending bigint, processing bigint, completed bigint,
               failed bigint, dead_letter bigint)
LANGUAGE sql STABLE AS $$
    SELECT p.id, n.total - n.below - n.done - n.leased, n.leased,
           n.below + n.done - n.failed - n.dead_letter, n.failed, n.dead_letter
    FROM unnest(p_partitions) p(id)
    LEFT JOIN queen.partition_counts k ON k.partition_id = p.id
    LEFT JOIN queen.consumers c ON c.partition_id = p.id AND c.consumer_group = '__queue__'
    CROSS JOIN LATERAL (
        SELECT coalesce(k.cursor_counted, 0) AS counted, coalesce(c.cursor_id, 0) AS cursor
    ) w
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE f.status = 'failed') AS failed,
               count(*) FILTER (WHERE f.status = 'dead_letter') AS dead_letter
        FROM (SELECT f.status FROM queen.failures f
              WHERE f.partition_id = p.id AND f.consumer_group = '__queue__'
                AND f.message_id > w.counted
              ORDER BY f.message_id LIMIT p_cap) f
    ) f
    CROSS JOIN LATERAL (
        SELECT coalesce(k.total, 0)
                   + queen.count_range(p.id, coalesce(k.counted_id, 0), 9223372036854775807, p_cap)
                   AS total,
               CASE WHEN w.cursor >= w.counted
                    THEN coalesce(k.below, 0) + queen.count_range(p.id, w.counted, w.cursor, p_cap)
                    ELSE coalesce(k.below, 0) - queen.count_range(p.id, w.cursor, w.counted, p_cap)
               END AS below,
               (SELECT count(*) FROM unnest(c.done_ids) d
                JOIN queen.messages m ON m.partition_id = p.id AND m.id = d) AS done,
               CASE WHEN c.lease_id IS NOT NULL AND c.lease_expires_at > now() THEN
                   (SELECT count(*) FROM queen.messages m
                    WHERE m.partition_id = p.id AND m.id > c.cursor_id
                      AND m.id <= c.lease_last_id AND m.id <> ALL (c.done_ids)
                      AND m.id <> ALL (c.lease_acked))
               ELSE 0 END AS leased,
               coalesce(k.failed, 0) + f.failed AS failed,
               coalesce(k.dead_letter, 0) + f.dead_letter AS dead_letter
    ) n
$$;

-- Newest first, up to p_wanted ids of one partition's messages in queue mode's status
-- p_status (NULL: any): walks of a primary key from the tail, the cursor or the lease,
-- or of the failure records.
CREATE OR REPLACE FUNCTION queen.page_ids(p_partition uuid, p_status text, p_wanted integer)
RETURNS SETOF bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c    queen.consumers;
    live boolean;
BEGIN
    SELECT * INTO c FROM queen.consumers x
    WHERE x.partition_id = p_partition AND x.consumer_group = '__queue__';
    c.cursor_id := coalesce(c.cursor_id, 0);
    c.done_ids := coalesce(c.done_ids, '{}');
    c.lease_acked := coalesce(c.lease_acked, '{}');
    live := coalesce(c.lease_id IS NOT NULL AND c.lease_expires_at > now(), false);
    IF p_status IS NULL THEN
        RETURN QUERY SELECT m.id FROM queen.messages m
                     WHERE m.partition_id = p_partition ORDER BY m.id DESC LIMIT p_wanted;
    ELSIF p_status IN ('failed', 'dead_letter') THEN
        RETURN QUERY SELECT f.message_id FROM queen.failures f
                     WHERE f.partition_id = p_partition AND f.consumer_group = '__queue__'
                       AND f.status = p_status
                     ORDER BY f.message_id DESC LIMIT p_wanted;
    ELSIF p_status = 'processing' THEN
        IF live THEN
            RETURN QUERY SELECT m.id FROM queen.messages m
                         WHERE m.partition_id = p_partition AND m.id > c.cursor_id
                           AND m.id <= c.lease_last_id AND m.id <> ALL (c.done_ids)
                           AND m.id <> ALL (c.lease_acked)
                         ORDER BY m.id DESC LIMIT p_wanted;
        END IF;
    ELSIF p_status = 'pending' THEN
        RETURN QUERY SELECT m.id FROM queen.messages m
                     WHERE m.partition_id = p_partition AND m.id > c.cursor_id
                       AND m.id <> ALL (c.done_ids)
                       AND NOT (live AND m.id <= c.lease_last_id AND m.id <> ALL (c.lease_acked))
                     ORDER BY m.id DESC LIMIT p_wanted;
    ELSE  -- completed: at or below the cursor, or done past it, with no final failure
        RETURN QUERY
        SELECT x.id FROM (
            (SELECT m.id FROM queen.messages m
             WHERE m.partition_id = p_partition AND m.id <= c.cursor_id
               AND NOT EXISTS (SELECT 1 FROM queen.failures f
                               WHERE f.partition_id = p_partition
                                 AND f.consumer_group = '__queue__' AND f.message_id = m.id
                                 AND f.status <> 'retry')
             ORDER BY m.id DESC LIMIT p_wanted)
            UNION ALL
            SELECT m.id FROM unnest(c.done_ids) d
            JOIN queen.messages m ON m.partition_id = p_partition AND m.id = d
            WHERE NOT EXISTS (SELECT 1 FROM queen.failures f
                              WHERE f.partition_id = p_partition
                                AND f.consumer_group = '__queue__' AND f.message_id = m.id
                                AND f.status <> 'retry')
        ) x ORDER BY x.id DESC LIMIT p_wanted;
    END IF;
END
$$;

-- One page of the messages of partitions p_partitions in status p_status (NULL: any),
-- newest first: (partition, id) pairs. Without a status only the partitions whose newest
-- message is among the p_limit + p_offset newest partition heads can hold the page.
CREATE OR REPLACE FUNCTION queen.message_page(p_partitions uuid[], p_status text,
                                              p_limit integer, p_offset integer)
RETURNS TABLE (partition_id uuid, id bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    wanted  integer := p_limit + p_offset;
    scanned uuid[] := p_partitions;
BEGIN
    IF p_status IS NULL AND cardinality(p_partitions) > wanted THEN
        scanned := ARRAY(
            SELECT t.pid FROM unnest(p_partitions) t(pid)
            CROSS JOIN LATERAL (SELECT m.id FROM queen.messages m
                                WHERE m.partition_id = t.pid
                                ORDER BY m.id DESC LIMIT 1) h
            ORDER BY h.id DESC LIMIT wanted);
    END IF;
    RETURN QUERY
    SELECT t.pid, x.id FROM unnest(scanned) t(pid)
    CROSS JOIN LATERAL queen.page_ids(t.pid, p_status, wanted) x(id)
    ORDER BY x.id DESC LIMIT p_limit OFFSET p_offset;
END
$$;

-- The messages (p_partitions[i], p_ids[i]) as the API shows them, in that order:
-- queue mode's status, its lease (workerId, lockedAt: the lease's start as leaseTime
-- before its expiry, leaseExpiresAt) while processing, completedAt from the completion
-- record holding it (the first ending at or after it: one probe; NULL when that one does
-- not start by it, as for messages a seek passed), failure fields and retryCount from
-- its failure record.
-- (An earlier build's returned no partition_id: a changed result type cannot be replaced,
-- so that one is dropped, once.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure('queen.message_rows(uuid[], bigint[])')
                 AND NOT 'partition_id' = ANY (p.proargnames)) THEN
        DROP FUNCTION queen.message_rows(uuid[], bigint[]);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION queen.message_rows(p_partitions uuid[], p_ids bigint[])
RETURNS TABLE (id uuid, message_id bigint, transaction_id text, queue text, partition text,
               namespace text, task text, payload jsonb, encrypted boolean, status text,
               worker_id text, created_at timestamptz, locked_at timestamptz,
               completed_at timestamptz, failed_at timestamptz, error_message text,
               retry_count integer, lease_expires_at timestamptz, producer text,
               partition_id uuid)
LANGUAGE sql STABLE AS $$
    SELECT queen.message_uuid(m.id, m.created_at), m.id,
           queen.txid(m.transaction_id, m.partition_id, m.id), q.name,
           p.name, q.namespace, q.task, m.payload, m.encrypted, s.status,
           CASE WHEN s.status = 'processing' THEN c.leased_by END, m.created_at,
           CASE WHEN s.status = 'processing'
                THEN c.lease_expires_at - make_interval(secs => q.lease_time) END,
           CASE WHEN s.status = 'completed' THEN
               (SELECT CASE WHEN k.first_id <= m.id THEN k.acked_at END
                FROM queen.completions k
                WHERE k.partition_id = m.partition_id AND k.consumer_group = '__queue__'
                  AND k.last_id >= m.id
                ORDER BY k.last_id LIMIT 1) END,
           CASE WHEN s.status <> 'completed' OR f.status <> 'retry' THEN f.failed_at END,
           CASE WHEN s.status <> 'completed' OR f.status <> 'retry' THEN f.error END,
           coalesce(f.retry_count, 0),
           CASE WHEN s.status = 'processing' THEN c.lease_expires_at END,
           m.producer, m.partition_id
    FROM unnest(p_partitions, p_ids) WITH ORDINALITY t(partition_id, id, ord)
    JOIN queen.messages m ON m.partition_id = t.partition_id AND m.id = t.id
    JOIN queen.partitions p ON p.id = m.partition_id
    JOIN queen.queues q ON q.id = p.queue_id
    LEFT JOIN queen.consumers c
           ON c.partition_id = m.partition_id AND c.consumer_group = '__queue__'
    LEFT JOIN queen.failures f
           ON f.partition_id = m.partition_id AND f.consumer_group = '__queue__'
          AND f.message_id = m.id
    CROSS JOIN LATERAL (SELECT queen.message_status(m.id, c, f.status) AS status) s
    ORDER BY t.ord
$$;

-- The messages of the same partition nearest in time to message p_txid (within an hour
-- either side, itself left out), up to p_limit, oldest first: (partition, id) pairs; no
-- row at all when it does not exist, one with id NULL when it has no neighbour. The
-- candidates are the p_limit nearest by id either side (ids follow time within a
-- partition), so that a walk never goes further than that.
CREATE OR REPLACE FUNCTION queen.related_messages(p_txid text, p_limit integer)
RETURNS TABLE (partition_id uuid, id bigint)
LANGUAGE sql STABLE AS $$
    WITH anchor AS (
        SELECT m.partition_id, m.id, m.created_at FROM queen.named(p_txid) n
        JOIN queen.messages m ON m.partition_id = n.partition_id AND m.id = n.id
    ), near AS (
        SELECT r.* FROM anchor a CROSS JOIN LATERAL (
            SELECT x.id, x.created_at FROM queen.messages x
            WHERE x.partition_id = a.partition_id AND x.id < a.id
            ORDER BY x.id DESC LIMIT p_limit) r
        WHERE r.created_at >= a.created_at - interval '1 hour'
        UNION ALL
        SELECT r.* FROM anchor a CROSS JOIN LATERAL (
            SELECT x.id, x.created_at FROM queen.messages x
            WHERE x.partition_id = a.partition_id AND x.id > a.id
            ORDER BY x.id LIMIT p_limit) r
        WHERE r.created_at <= a.created_at + interval '1 hour'
    ), nearest AS (
        SELECT n.* FROM near n, anchor a
        ORDER BY abs(extract(epoch FROM n.created_at - a.created_at)), n.id
        LIMIT p_limit
    )
    SELECT a.partition_id, n.id FROM anchor a LEFT JOIN nearest n ON true
    ORDER BY n.created_at, n.id
$$;
