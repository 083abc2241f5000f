-- 0004: what the analytics, resources and message-management endpoints read and change.

-- Message listing pages through messages newest first (created_at DESC, seq DESC):
-- a page of any filter that matches a fair share of the table walks this index.
-- Inserts append at its right edge (created_at and seq only grow), so pushes barely
-- notice it (measured within noise at 4 x 100-message batches).
CREATE INDEX messages_created ON queen.messages (created_at, seq);
-- The rare statuses an operator looks for; empty at insert time (messages start
-- pending), so it costs nothing on push. Its condition is a column of its own: with
-- status there, every status change would change an indexed value (no HOT update, see
-- messages_partition_seq); is_failed changes only on the move to or from these statuses.
-- Listings filtered by one of them also test is_failed, so the planner can use it.
ALTER TABLE queen.messages
    ADD COLUMN is_failed boolean GENERATED ALWAYS AS (status IN ('failed', 'dead_letter')) STORED;
CREATE INDEX messages_failed ON queen.messages (created_at, seq) WHERE is_failed;

-- Processing times per hour and partition (completions only), kept for the rolling
-- 24 h window of queue-lag. Filled from metrics_minute by trigger; rows leave the
-- window (and this table) when their hour is more than 24 h old.
CREATE TABLE queen.lag_hour (
    hour       timestamptz NOT NULL,
    queue      text NOT NULL,
    partition  text NOT NULL,
    completed  bigint NOT NULL DEFAULT 0,
    lag_ms     bigint NOT NULL DEFAULT 0,   -- sum of created -> completed
    lag_hist   integer[],                   -- LAG_BUCKETS counts
    PRIMARY KEY (hour, queue, partition)
);

-- The sum of lag_hour over the window, one row per partition: queue-lag reads this
-- (a few rows per partition) instead of summing 24 h of per-minute histograms.
CREATE TABLE queen.lag_window (
    queue      text NOT NULL,
    partition  text NOT NULL,
    completed  bigint NOT NULL DEFAULT 0,
    lag_ms     bigint NOT NULL DEFAULT 0,
    lag_hist   integer[],
    PRIMARY KEY (queue, partition)
) WITH (fillfactor = 70);

-- Element-wise a - b of two histograms (NULL counts as empty).
CREATE FUNCTION queen.hist_sub(a integer[], b integer[]) RETURNS integer[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN b IS NULL THEN a ELSE
        (SELECT array_agg(coalesce(x, 0) - coalesce(y, 0) ORDER BY i)
         FROM unnest(a, b) WITH ORDINALITY t(x, y, i)) END
$$;

-- Serialises changes of lag_hour / lag_window (folds and expiry), so they never deadlock.
CREATE FUNCTION queen.lag_lock_key() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('queen.lag_window', 7)
$$;

-- Drop the hours that left the 24 h window and subtract them from lag_window.
-- Skips (returns -1) when another transaction is changing the window right now.
CREATE FUNCTION queen.expire_lag_window() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    expired integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(queen.lag_lock_key()) THEN
        RETURN -1;
    END IF;
    WITH gone AS (
        DELETE FROM queen.lag_hour h
        WHERE h.hour < date_trunc('hour', now()) - interval '24 hours'
        RETURNING h.queue, h.partition, h.completed, h.lag_ms, h.lag_hist
    ), per_partition AS (
        SELECT g.queue, g.partition, sum(g.completed) AS completed, sum(g.lag_ms) AS lag_ms,
               queen.hist_sum(g.lag_hist) AS lag_hist
        FROM gone g GROUP BY 1, 2
    )
    UPDATE queen.lag_window w SET
        completed = w.completed - d.completed,
        lag_ms = w.lag_ms - d.lag_ms,
        lag_hist = queen.hist_sub(w.lag_hist, d.lag_hist)
    FROM per_partition d
    WHERE w.queue = d.queue AND w.partition = d.partition;
    GET DIAGNOSTICS expired = ROW_COUNT;
    IF expired > 0 THEN
        DELETE FROM queen.lag_window w WHERE w.completed <= 0;
    END IF;
    RETURN expired;
END
$$;

-- Completions to add to lag_hour / lag_window, staged by the metrics_minute triggers.
-- Takes the lock that serialises changes of the window (held until commit).
CREATE FUNCTION queen.lag_batch_begin() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(queen.lag_lock_key());
    CREATE TEMP TABLE IF NOT EXISTS lag_batch (
        hour timestamptz, queue text, partition text,
        completed bigint, lag_ms bigint, lag_hist integer[]
    ) ON COMMIT DELETE ROWS;
    DELETE FROM lag_batch;
END
$$;

-- Add the staged completions to lag_hour and lag_window, then expire old hours.
CREATE FUNCTION queen.lag_batch_apply() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen.lag_hour AS h (hour, queue, partition, completed, lag_ms, lag_hist)
    SELECT b.hour, b.queue, b.partition, sum(b.completed), sum(b.lag_ms), queen.hist_sum(b.lag_hist)
    FROM lag_batch b GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (hour, queue, partition) DO UPDATE SET
        completed = h.completed + EXCLUDED.completed,
        lag_ms = h.lag_ms + EXCLUDED.lag_ms,
        lag_hist = queen.hist_add(h.lag_hist, EXCLUDED.lag_hist);

    INSERT INTO queen.lag_window AS w (queue, partition, completed, lag_ms, lag_hist)
    SELECT b.queue, b.partition, sum(b.completed), sum(b.lag_ms), queen.hist_sum(b.lag_hist)
    FROM lag_batch b GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (queue, partition) DO UPDATE SET
        completed = w.completed + EXCLUDED.completed,
        lag_ms = w.lag_ms + EXCLUDED.lag_ms,
        lag_hist = queen.hist_add(w.lag_hist, EXCLUDED.lag_hist);
    DELETE FROM lag_batch;

    PERFORM queen.expire_lag_window();
END
$$;

CREATE FUNCTION queen.metrics_minute_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows WHERE completed <> 0) THEN
        RETURN NULL;
    END IF;
    PERFORM queen.lag_batch_begin();
    INSERT INTO lag_batch
    SELECT date_trunc('hour', n.minute), n.queue, n.partition,
           sum(n.completed), sum(n.lag_ms), queen.hist_sum(n.lag_hist)
    FROM new_rows n WHERE n.completed <> 0
    GROUP BY 1, 2, 3;
    PERFORM queen.lag_batch_apply();
    RETURN NULL;
END
$$;

CREATE FUNCTION queen.metrics_minute_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows n JOIN old_rows o USING (minute, queue, partition)
                   WHERE n.completed <> o.completed) THEN
        RETURN NULL;
    END IF;
    PERFORM queen.lag_batch_begin();
    INSERT INTO lag_batch
    SELECT date_trunc('hour', n.minute), n.queue, n.partition,
           n.completed - o.completed, n.lag_ms - o.lag_ms, queen.hist_sub(n.lag_hist, o.lag_hist)
    FROM new_rows n JOIN old_rows o USING (minute, queue, partition)
    WHERE n.completed <> o.completed;
    PERFORM queen.lag_batch_apply();
    RETURN NULL;
END
$$;

CREATE TRIGGER metrics_minute_lag_inserted AFTER INSERT ON queen.metrics_minute
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION queen.metrics_minute_inserted();

CREATE TRIGGER metrics_minute_lag_updated AFTER UPDATE ON queen.metrics_minute
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION queen.metrics_minute_updated();

-- Per-minute activity not folded into metrics_minute yet (same rules as fold_deltas),
-- so time series are exact even between maintenance cycles.
CREATE VIEW queen.metrics_minute_unfolded AS
SELECT date_trunc('minute', d.at) AS minute, q.name AS queue, p.name AS partition,
       coalesce(sum(d.n) FILTER (WHERE d.from_status IS NULL), 0) AS incoming,
       coalesce(sum(d.n) FILTER (WHERE d.from_status = 'pending' AND d.to_status = 'processing'), 0) AS popped,
       coalesce(sum(d.n) FILTER (WHERE d.to_status = 'completed'), 0) AS completed,
       coalesce(sum(d.n) FILTER (WHERE d.from_status = 'processing'
                                 AND d.to_status IN ('pending', 'failed')), 0) AS failed,
       coalesce(sum(d.n) FILTER (WHERE d.to_status = 'dead_letter'), 0) AS dead_letter,
       sum(d.lag_ms) AS lag_ms,
       queen.hist_sum(d.lag_hist) AS lag_hist
FROM queen.status_deltas d
JOIN queen.partitions p ON p.id = d.partition_id
JOIN queen.queues q ON q.id = p.queue_id
GROUP BY 1, 2, 3;

-- Backlog and processing times of the last 24 h (hour granularity) per partition of the
-- queues matching the filters (NULL: any), including completions not folded yet.
CREATE FUNCTION queen.partition_lag(p_queue text, p_namespace text, p_task text)
RETURNS TABLE (queue text, namespace text, task text, partition text,
               pending bigint, processing bigint, completed bigint, lag_ms bigint,
               lag_hist integer[])
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queen.expire_lag_window();
    RETURN QUERY
    SELECT q.name, q.namespace, q.task, p.name, s.pending, s.processing,
           (coalesce(w.completed, 0) + coalesce(u.completed, 0))::bigint,
           (coalesce(w.lag_ms, 0) + coalesce(u.lag_ms, 0))::bigint,
           queen.hist_add(w.lag_hist, u.lag_hist)
    FROM queen.queues q
    JOIN queen.partitions p ON p.queue_id = q.id
    JOIN queen.partition_stats s ON s.partition_id = p.id
    LEFT JOIN queen.lag_window w ON w.queue = q.name AND w.partition = p.name
    LEFT JOIN (
        SELECT d.partition_id, sum(d.n) AS completed, sum(d.lag_ms) AS lag_ms,
               queen.hist_sum(d.lag_hist) AS lag_hist
        FROM queen.status_deltas d
        WHERE d.to_status = 'completed' AND d.at >= date_trunc('hour', now()) - interval '24 hours'
        GROUP BY 1
    ) u ON u.partition_id = p.id
    WHERE (p_queue IS NULL OR q.name = p_queue)
      AND (p_namespace IS NULL OR q.namespace = p_namespace)
      AND (p_task IS NULL OR q.task = p_task)
    ORDER BY q.name, p.name;
END
$$;

-- Delete one message; free its partition when it was the last one of a lease.
-- Returns its former status, or nothing when there is no such message.
CREATE FUNCTION queen.delete_message(p_transaction_id text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    gone record;
BEGIN
    DELETE FROM queen.messages m WHERE m.transaction_id = p_transaction_id
    RETURNING m.status, m.partition_id, m.lease_id INTO gone;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF gone.status = 'processing' THEN
        UPDATE queen.partitions p
        SET lease_id = NULL, lease_expires_at = NULL, leased_by = NULL,
            lease_first_seq = NULL, lease_last_seq = NULL, lease_size = NULL
        WHERE p.id = gone.partition_id AND p.lease_id = gone.lease_id
          AND NOT queen.lease_open(p.id, gone.lease_id);
    END IF;
    RETURN gone.status;
END
$$;

-- Move one message from p_from (a set of statuses) to p_to ('pending' for a retry,
-- 'dead_letter' for a move to the DLQ). Returns the status it had: when that is not in
-- p_from nothing changed; no row when there is no such message.
CREATE FUNCTION queen.set_message_status(p_transaction_id text, p_from text[], p_to text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    current  text;
    part     uuid;
    moved    bigint;  -- its seq
BEGIN
    SELECT m.status INTO current FROM queen.messages m
    WHERE m.transaction_id = p_transaction_id
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF current = ANY (p_from) THEN
        UPDATE queen.messages m SET
            status = p_to,
            retry_count = CASE WHEN p_to = 'pending' THEN 0 ELSE m.retry_count END,
            failed_at = CASE WHEN p_to = 'dead_letter' THEN coalesce(m.failed_at, now())
                             ELSE m.failed_at END,
            error_message = CASE WHEN p_to = 'dead_letter'
                                 THEN coalesce(m.error_message, 'moved to dead letter queue')
                                 ELSE m.error_message END,
            lease_id = NULL, lease_expires_at = NULL, worker_id = NULL, locked_at = NULL
        WHERE m.transaction_id = p_transaction_id
        RETURNING m.partition_id, m.seq INTO part, moved;
        PERFORM queen.record_changes(ARRAY[ROW(part, current, p_to, NULL)::queen.status_change]);
        IF p_to = 'pending' THEN
            PERFORM queen.mark_pending(ARRAY[part], ARRAY[moved]);
        END IF;
    END IF;
    RETURN current;
END
$$;

-- Delete every message of a queue, or of one of its partitions, and free their leases.
-- Returns the number deleted; NULL when the queue (or the partition) does not exist.
CREATE FUNCTION queen.clear_messages(p_queue text, p_partition text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    targets uuid[];
    cleared bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.name = p_queue) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(p.id ORDER BY p.id) INTO targets
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE q.name = p_queue AND (p_partition IS NULL OR p.name = p_partition);
    IF targets IS NULL THEN
        RETURN CASE WHEN p_partition IS NULL THEN 0 END;
    END IF;
    PERFORM 1 FROM queen.partitions p WHERE p.id = ANY (targets) ORDER BY p.id FOR NO KEY UPDATE;
    DELETE FROM queen.messages m WHERE m.partition_id = ANY (targets);
    GET DIAGNOSTICS cleared = ROW_COUNT;
    UPDATE queen.partitions p SET lease_id = NULL, lease_expires_at = NULL, leased_by = NULL
    WHERE p.id = ANY (targets) AND p.lease_id IS NOT NULL;
    RETURN cleared;
END
$$;
