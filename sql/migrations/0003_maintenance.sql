-- 0003: time-driven work of the maintenance process: lease expiry, due wake-ups, partition
-- cleanup, count reconciliation; storage settings for the tables that churn.

-- Churn settings. Every pop and ack rewrites a partition row (lease columns) and every
-- fold rewrites count and metric rows: leave room on the page for the new version and
-- vacuum after a small number of dead rows instead of a fraction of the table.
ALTER TABLE queen.partitions SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE queen.partition_heads SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
-- Appended by every status change and emptied by every fold: a queue of its own.
ALTER TABLE queen.status_deltas SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE queen.partition_counts SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE queen.metrics_minute SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000
);

-- Statistics only for the columns queries select messages by. ANALYZE of a growing
-- table runs again and again (autovacuum, or maintenance when the table doubled), and
-- the payload, texts and ids cost it most: 31,000 messages, 250 -> 55 ms.
ALTER TABLE queen.messages
    ALTER COLUMN payload SET STATISTICS 0,
    ALTER COLUMN error_message SET STATISTICS 0,
    ALTER COLUMN worker_id SET STATISTICS 0,
    ALTER COLUMN id SET STATISTICS 0,
    ALTER COLUMN transaction_id SET STATISTICS 0,  -- unique: the planner knows from its index
    ALTER COLUMN lease_id SET STATISTICS 0,
    ALTER COLUMN locked_at SET STATISTICS 0,
    ALTER COLUMN lease_expires_at SET STATISTICS 0,
    ALTER COLUMN failed_at SET STATISTICS 0;

-- Release up to p_limit expired partition leases, skipping partitions someone holds
-- (release_lease wakes a poll for each freed partition that still holds pending work).
-- Returns the leases released, the messages they covered, and the seconds until the next
-- lease expires.
CREATE FUNCTION queen.expire_leases(p_limit integer)
RETURNS TABLE (leases integer, messages integer, next_expiry_in double precision)
LANGUAGE plpgsql AS $$
DECLARE
    part  record;
    freed uuid[] := '{}';
    total integer := 0;
BEGIN
    FOR part IN
        SELECT p.id, p.lease_id FROM queen.partitions p
        WHERE p.lease_id IS NOT NULL AND p.lease_expires_at <= now()
        ORDER BY p.lease_expires_at
        LIMIT p_limit
        FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        total := total + queen.release_lease(part.id, part.lease_id);
        freed := freed || part.id;
    END LOOP;

    RETURN QUERY
    SELECT cardinality(freed), total,
           extract(epoch FROM min(p.lease_expires_at) - clock_timestamp())::double precision
    FROM queen.partitions p
    WHERE p.lease_id IS NOT NULL;
END
$$;

-- When a partition of a delayed or windowed queue becomes poppable: its oldest pending
-- message is delayedProcessing old and its newest is windowBuffer old (what claim checks).
-- NULL when it holds nothing pending.
CREATE FUNCTION queen.partition_due_at(p_partition uuid, p_delay integer, p_window integer)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT greatest(
        -- (The head as a scalar subquery: a bound of the index walk in every plan.)
        CASE WHEN p_delay > 0 THEN
            (SELECT m.created_at FROM queen.messages m
             WHERE m.partition_id = p_partition AND m.status = 'pending'
               AND m.seq >= (SELECT h.head_seq FROM queen.partition_heads h
                             WHERE h.partition_id = p_partition)
             ORDER BY m.seq LIMIT 1) + make_interval(secs => p_delay) END,
        CASE WHEN p_window > 0 THEN
            (SELECT m.created_at FROM queen.messages m
             WHERE m.partition_id = p_partition AND m.status = 'pending'
               AND m.seq >= (SELECT h.head_seq FROM queen.partition_heads h
                             WHERE h.partition_id = p_partition)
             ORDER BY m.seq DESC LIMIT 1) + make_interval(secs => p_window) END)
$$;

-- Wake polls for the delayed/windowed partitions that became poppable after p_since (the
-- scanned_at of the previous call; -infinity the first time). Returns how many were
-- woken, the seconds until the next one becomes due (NULL: none waiting) and the time
-- of this scan.
CREATE FUNCTION queen.wake_due(p_since timestamptz)
RETURNS TABLE (woken integer, next_due_in double precision, scanned_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    at       timestamptz := clock_timestamp();
    due      uuid[];
    next_due timestamptz;
BEGIN
    SELECT array_agg(t.partition_id) FILTER (WHERE t.due_at > p_since AND t.due_at <= at),
           min(t.due_at) FILTER (WHERE t.due_at > at)
    INTO due, next_due
    FROM (SELECT h.partition_id,
                 queen.partition_due_at(h.partition_id, q.delayed_processing, q.window_buffer)
                     AS due_at
          FROM queen.queues q JOIN queen.partition_heads h ON h.queue_id = q.id
          WHERE q.delayed_processing > 0 OR q.window_buffer > 0) t;
    IF due IS NOT NULL THEN
        PERFORM queen.notify_partitions(due);
    END IF;
    RETURN QUERY SELECT coalesce(cardinality(due), 0),
                        extract(epoch FROM next_due - at)::double precision, at;
END
$$;

-- Remove up to p_limit partitions that hold no message, no lease, and saw no activity for
-- p_idle_seconds. A push locks the partitions it writes to (FOR KEY SHARE) before it
-- inserts, so SKIP LOCKED passes over those; the emptiness re-check runs on a snapshot
-- taken after the locks, so it sees every push that committed before them.
CREATE FUNCTION queen.cleanup_partitions(p_idle_seconds integer, p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    locked  uuid[];
    removed integer;
BEGIN
    SELECT array_agg(c.id) INTO locked FROM (
        SELECT p.id FROM queen.partitions p
        WHERE p.last_activity_at < now() - make_interval(secs => p_idle_seconds)
          AND p.created_at < now() - make_interval(secs => p_idle_seconds)
          AND p.lease_id IS NULL
          AND NOT EXISTS (SELECT 1 FROM queen.messages m WHERE m.partition_id = p.id)
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED) c;
    IF locked IS NULL THEN
        RETURN 0;
    END IF;

    DELETE FROM queen.partitions p
    WHERE p.id = ANY (locked) AND p.lease_id IS NULL
      AND NOT EXISTS (SELECT 1 FROM queen.messages m WHERE m.partition_id = p.id);
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
END
$$;

-- Recount partitions after p_after (in id order) and correct drift in partition_counts:
-- at most p_limit partitions and, past the first, no more than p_budget rows in all
-- (by the believed counts), so a run costs about the same however big the table is.
-- Counts and unfolded deltas are read in one snapshot, where they must add up to the
-- rows; the difference is added (not assigned), so a concurrent fold stays right.
-- A partition holding at most p_budget rows is counted in one walk of all its rows;
-- of a bigger one only the pending messages (from its head) and those of its lease (its
-- seq range), when there are at most p_budget of them. Returns one row per partition
-- looked at, with the drift found (0: none); no row when nothing follows p_after.
CREATE FUNCTION queen.reconcile_counts(p_after uuid, p_limit integer, p_budget bigint)
RETURNS TABLE (partition_id uuid, drift bigint)
LANGUAGE sql AS $$
    WITH candidates AS (
        SELECT s.*, s.pending + s.processing + s.completed + s.failed + s.dead_letter AS total
        FROM queen.partition_stats s
        WHERE p_after IS NULL OR s.partition_id > p_after
        ORDER BY s.partition_id LIMIT p_limit
    ), believed AS (
        SELECT c.* FROM (
            SELECT c.*, sum(c.total) OVER (ORDER BY c.partition_id) - c.total AS before
            FROM candidates c) c
        WHERE c.before < greatest(p_budget, 1)
    ), actual AS (
        SELECT b.partition_id,
               n.pending - b.pending AS d_pending,
               n.processing - b.processing AS d_processing,
               coalesce(n.completed - b.completed, 0) AS d_completed,
               coalesce(n.failed - b.failed, 0) AS d_failed,
               coalesce(n.dead_letter - b.dead_letter, 0) AS d_dead_letter
        FROM believed b
        CROSS JOIN LATERAL (
            SELECT count(*) FILTER (WHERE m.status = 'pending') AS pending,
                   count(*) FILTER (WHERE m.status = 'processing') AS processing,
                   count(*) FILTER (WHERE m.status = 'completed') AS completed,
                   count(*) FILTER (WHERE m.status = 'failed') AS failed,
                   count(*) FILTER (WHERE m.status = 'dead_letter') AS dead_letter
            FROM queen.messages m
            WHERE m.partition_id = b.partition_id AND b.total <= p_budget
            HAVING b.total <= p_budget  -- (an aggregate gives a row even of nothing)
            UNION ALL
            SELECT (SELECT count(*) FROM queen.partition_heads h
                    JOIN queen.messages m ON m.partition_id = h.partition_id
                                         AND m.seq >= h.head_seq
                    WHERE h.partition_id = b.partition_id AND m.status = 'pending'),
                   (SELECT count(*) FROM queen.partitions p
                    JOIN queen.messages m ON m.partition_id = p.id
                                         AND m.seq BETWEEN p.lease_first_seq AND p.lease_last_seq
                    WHERE p.id = b.partition_id AND m.status = 'processing'
                      AND m.lease_id = p.lease_id),
                   NULL, NULL, NULL
            WHERE b.total > p_budget) n
        WHERE b.pending + b.processing <= p_budget
    ), fixed AS (
        INSERT INTO queen.partition_counts AS c
            (partition_id, pending, processing, completed, failed, dead_letter, updated_at)
        SELECT a.partition_id, a.d_pending, a.d_processing, a.d_completed, a.d_failed,
               a.d_dead_letter, now()
        FROM actual a
        WHERE (a.d_pending, a.d_processing, a.d_completed, a.d_failed, a.d_dead_letter)
              <> (0, 0, 0, 0, 0)
        ORDER BY a.partition_id
        ON CONFLICT ON CONSTRAINT partition_counts_pkey DO UPDATE SET
            pending = c.pending + EXCLUDED.pending,
            processing = c.processing + EXCLUDED.processing,
            completed = c.completed + EXCLUDED.completed,
            failed = c.failed + EXCLUDED.failed,
            dead_letter = c.dead_letter + EXCLUDED.dead_letter,
            updated_at = now()
        RETURNING c.partition_id
    )
    SELECT b.partition_id,
           coalesce(abs(a.d_pending) + abs(a.d_processing) + abs(a.d_completed)
                    + abs(a.d_failed) + abs(a.d_dead_letter), 0)
    FROM believed b LEFT JOIN actual a ON a.partition_id = b.partition_id
    ORDER BY b.partition_id
$$;

-- Pending messages older than their queue's age limit: 'ttl', or 'retention'
-- (retentionSeconds, when retention is on). Taken from the head of each partition with
-- work, oldest first, at most p_limit, and locked for the caller's statement (rows another
-- session holds are skipped). Maintenance dead-letters the first kind and deletes the second.
CREATE FUNCTION queen.overdue_pending(p_kind text, p_limit integer) RETURNS SETOF text
LANGUAGE sql AS $$
    WITH limits AS (
        SELECT q.id, CASE p_kind WHEN 'ttl' THEN q.ttl
                                 WHEN 'retention' THEN
                                     CASE WHEN q.retention_enabled THEN q.retention_seconds ELSE 0 END
                     END AS age_s
        FROM queen.queues q
    ), heads AS (
        SELECT h.partition_id, h.head_seq, now() - make_interval(secs => l.age_s) AS cutoff
        FROM limits l JOIN queen.partition_heads h ON h.queue_id = l.id
        WHERE l.age_s > 0
          AND (SELECT m.created_at FROM queen.messages m
               WHERE m.partition_id = h.partition_id AND m.seq >= h.head_seq
                 AND m.status = 'pending'
               ORDER BY m.seq LIMIT 1) < now() - make_interval(secs => l.age_s)
    ), doomed AS (
        SELECT m.transaction_id
        FROM heads h CROSS JOIN LATERAL (
            SELECT x.transaction_id, x.created_at FROM queen.messages x
            WHERE x.partition_id = h.partition_id AND x.seq >= h.head_seq
              AND x.status = 'pending'
            ORDER BY x.seq LIMIT p_limit) m
        WHERE m.created_at < h.cutoff
        LIMIT p_limit
    )
    SELECT x.transaction_id FROM queen.messages x
    WHERE x.transaction_id = ANY (ARRAY(SELECT transaction_id FROM doomed)) AND x.status = 'pending'
    FOR UPDATE SKIP LOCKED
$$;
