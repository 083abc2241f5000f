-- 0002: status accounting without contention: every change appends a delta, maintenance folds them.

-- Every change of a message's status, summed per statement and partition. Append-only
-- (no row is updated in the hot path, so concurrent statements never wait on each other).
CREATE TABLE queen.status_deltas (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    partition_id uuid NOT NULL,
    from_status  text,            -- NULL: the message was inserted
    to_status    text,            -- NULL: the message was deleted
    n            integer NOT NULL,
    lag_ms       bigint NOT NULL DEFAULT 0,   -- sum of created -> completed, for to_status = 'completed'
    lag_hist     integer[]                    -- LAG_BUCKETS counts, for to_status = 'completed'
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.05);

-- Folded counts per partition and status (what the analytics endpoints read, plus the
-- deltas not folded yet: see queen.partition_stats).
CREATE TABLE queen.partition_counts (
    partition_id uuid PRIMARY KEY REFERENCES queen.partitions (id) ON DELETE CASCADE,
    pending      bigint NOT NULL DEFAULT 0,
    processing   bigint NOT NULL DEFAULT 0,
    completed    bigint NOT NULL DEFAULT 0,
    failed       bigint NOT NULL DEFAULT 0,
    dead_letter  bigint NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);

-- Per-minute activity per partition (names kept so history outlives a removed partition).
-- incoming: inserted; popped: pending -> processing; completed; failed: failed acks and
-- expiries that will be retried or end failed; dead_letter: moved to dead_letter.
CREATE TABLE queen.metrics_minute (
    minute       timestamptz NOT NULL,
    queue        text NOT NULL,
    partition    text NOT NULL,
    incoming     bigint NOT NULL DEFAULT 0,
    popped       bigint NOT NULL DEFAULT 0,
    completed    bigint NOT NULL DEFAULT 0,
    failed       bigint NOT NULL DEFAULT 0,
    dead_letter  bigint NOT NULL DEFAULT 0,
    lag_ms       bigint NOT NULL DEFAULT 0,   -- sum over completed
    lag_hist     integer[],                   -- LAG_BUCKETS counts over completed
    PRIMARY KEY (minute, queue, partition)
);
CREATE INDEX metrics_minute_queue ON queen.metrics_minute (queue, minute);

-- Lag histogram bucket of a duration: half-powers of two of milliseconds, 64 buckets
-- (bucket b holds [2^(b/2), 2^((b+1)/2)) ms; the last one everything longer).
-- In double precision: numeric log() took 10 us per value, most of an ack's accounting
-- (the 1e-9 keeps exact powers of two in their own bucket despite rounding).
CREATE FUNCTION queen.lag_bucket(p_ms double precision) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(63, greatest(0, floor(2 * ln(greatest(p_ms, 1)) / ln(2) + 1e-9)::integer))
$$;

-- (PL/pgSQL rather than SQL here and in record_changes: called by every ack, and a SQL
-- function that cannot be inlined is parsed and planned again at each call. A loop
-- over the values, not a query: counting through a join with the 64 buckets took
-- 27 us for one value, the loop 1 us, and a third less for 100.)
CREATE FUNCTION queen.lag_histogram(p_ms double precision[]) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    hist   integer[] := array_fill(0, ARRAY[64]);
    ms     double precision;
    bucket integer;
BEGIN
    IF p_ms IS NOT NULL THEN
        FOREACH ms IN ARRAY p_ms LOOP
            bucket := queen.lag_bucket(ms) + 1;
            hist[bucket] := hist[bucket] + 1;
        END LOOP;
    END IF;
    RETURN hist;
END
$$;

-- Element-wise sum of two histograms (NULL counts as empty).
CREATE FUNCTION queen.hist_add(a integer[], b integer[]) RETURNS integer[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN a IS NULL THEN b WHEN b IS NULL THEN a ELSE
        (SELECT array_agg(x + y ORDER BY i) FROM unnest(a, b) WITH ORDINALITY t(x, y, i)) END
$$;

CREATE AGGREGATE queen.hist_sum(integer[]) (SFUNC = queen.hist_add, STYPE = integer[]);

CREATE FUNCTION queen.count_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen.status_deltas (partition_id, from_status, to_status, n)
    SELECT partition_id, NULL, status, count(*) FROM new_rows GROUP BY 1, 3;
    RETURN NULL;
END
$$;

-- Status changes are counted by the functions that make them (claim, ack, release_lease,
-- unclaim, the message admin functions, maintenance), not by an UPDATE trigger: a
-- statement trigger's transition tables copy the old and new version of every row
-- (payload included) and cost a fifth of a message's lifecycle. An UPDATE of
-- queen.messages made by hand is therefore not counted; reconcile_counts corrects it.
CREATE FUNCTION queen.record_changes(p_changes queen.status_change[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen.status_deltas (partition_id, from_status, to_status, n, lag_ms, lag_hist)
    SELECT c.partition_id, c.from_status, c.to_status, count(*),
           coalesce(sum(c.lag_ms), 0)::bigint,
           CASE WHEN c.to_status = 'completed' THEN queen.lag_histogram(array_agg(c.lag_ms)) END
    FROM unnest(p_changes) c
    WHERE c.from_status IS DISTINCT FROM c.to_status
    GROUP BY 1, 2, 3;
END
$$;
ALTER FUNCTION queen.record_changes(queen.status_change[]) SET plan_cache_mode = force_generic_plan;

CREATE FUNCTION queen.count_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen.status_deltas (partition_id, from_status, to_status, n)
    SELECT o.partition_id, o.status, NULL, count(*)
    FROM old_rows o
    WHERE EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = o.partition_id)
    GROUP BY 1, 2;
    RETURN NULL;
END
$$;

CREATE TRIGGER messages_count_inserted AFTER INSERT ON queen.messages
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION queen.count_inserted();

CREATE TRIGGER messages_count_deleted AFTER DELETE ON queen.messages
REFERENCING OLD TABLE AS old_rows
FOR EACH STATEMENT EXECUTE FUNCTION queen.count_deleted();

-- Fold the deltas (oldest first, at most p_limit rows) into partition_counts and
-- metrics_minute, and delete them. Run by maintenance every cycle; safe to run
-- concurrently (rows are claimed with SKIP LOCKED). Returns the rows folded.
CREATE FUNCTION queen.fold_deltas(p_limit integer DEFAULT 100000) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    folded integer;
BEGIN
    CREATE TEMP TABLE IF NOT EXISTS fold_batch (LIKE queen.status_deltas) ON COMMIT DELETE ROWS;
    WITH taken AS (
        DELETE FROM queen.status_deltas d
        WHERE d.id IN (SELECT id FROM queen.status_deltas ORDER BY id LIMIT p_limit
                       FOR UPDATE SKIP LOCKED)
        RETURNING d.*
    )
    INSERT INTO fold_batch SELECT * FROM taken;
    GET DIAGNOSTICS folded = ROW_COUNT;
    IF folded = 0 THEN
        RETURN 0;
    END IF;

    INSERT INTO queen.partition_counts AS c
        (partition_id, pending, processing, completed, failed, dead_letter, updated_at)
    SELECT s.partition_id,
           sum(s.n * ((s.to_status = 'pending')::int - (s.from_status = 'pending')::int)),
           sum(s.n * ((s.to_status = 'processing')::int - (s.from_status = 'processing')::int)),
           sum(s.n * ((s.to_status = 'completed')::int - (s.from_status = 'completed')::int)),
           sum(s.n * ((s.to_status = 'failed')::int - (s.from_status = 'failed')::int)),
           sum(s.n * ((s.to_status = 'dead_letter')::int - (s.from_status = 'dead_letter')::int)),
           now()
    FROM (SELECT b.partition_id, coalesce(b.from_status, '') AS from_status,
                 coalesce(b.to_status, '') AS to_status, b.n FROM fold_batch b) s
    WHERE EXISTS (SELECT 1 FROM queen.partitions p WHERE p.id = s.partition_id)
    GROUP BY s.partition_id
    ORDER BY s.partition_id
    ON CONFLICT (partition_id) DO UPDATE SET
        pending = c.pending + EXCLUDED.pending,
        processing = c.processing + EXCLUDED.processing,
        completed = c.completed + EXCLUDED.completed,
        failed = c.failed + EXCLUDED.failed,
        dead_letter = c.dead_letter + EXCLUDED.dead_letter,
        updated_at = now();

    INSERT INTO queen.metrics_minute AS m
        (minute, queue, partition, incoming, popped, completed, failed, dead_letter, lag_ms, lag_hist)
    SELECT date_trunc('minute', b.at), q.name, p.name,
           coalesce(sum(b.n) FILTER (WHERE b.from_status IS NULL), 0),
           coalesce(sum(b.n) FILTER (WHERE b.from_status = 'pending' AND b.to_status = 'processing'), 0),
           coalesce(sum(b.n) FILTER (WHERE b.to_status = 'completed'), 0),
           coalesce(sum(b.n) FILTER (WHERE b.from_status = 'processing'
                              AND b.to_status IN ('pending', 'failed')), 0),
           coalesce(sum(b.n) FILTER (WHERE b.to_status = 'dead_letter'), 0),
           sum(b.lag_ms),
           queen.hist_sum(b.lag_hist)
    FROM fold_batch b
    JOIN queen.partitions p ON p.id = b.partition_id
    JOIN queen.queues q ON q.id = p.queue_id
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (minute, queue, partition) DO UPDATE SET
        incoming = m.incoming + EXCLUDED.incoming,
        popped = m.popped + EXCLUDED.popped,
        completed = m.completed + EXCLUDED.completed,
        failed = m.failed + EXCLUDED.failed,
        dead_letter = m.dead_letter + EXCLUDED.dead_letter,
        lag_ms = m.lag_ms + EXCLUDED.lag_ms,
        lag_hist = queen.hist_add(m.lag_hist, EXCLUDED.lag_hist);
    RETURN folded;
END
$$;

-- Current counts per partition: folded counts plus the deltas not folded yet.
-- Exact at the moment of the query, cheap while maintenance keeps status_deltas short.
CREATE VIEW queen.partition_stats AS
SELECT p.id AS partition_id, p.queue_id,
       coalesce(c.pending, 0) + coalesce(d.pending, 0) AS pending,
       coalesce(c.processing, 0) + coalesce(d.processing, 0) AS processing,
       coalesce(c.completed, 0) + coalesce(d.completed, 0) AS completed,
       coalesce(c.failed, 0) + coalesce(d.failed, 0) AS failed,
       coalesce(c.dead_letter, 0) + coalesce(d.dead_letter, 0) AS dead_letter
FROM queen.partitions p
LEFT JOIN queen.partition_counts c ON c.partition_id = p.id
LEFT JOIN (
    SELECT s.partition_id,
           sum(s.n * ((s.to_status = 'pending')::int - (s.from_status = 'pending')::int)) AS pending,
           sum(s.n * ((s.to_status = 'processing')::int - (s.from_status = 'processing')::int)) AS processing,
           sum(s.n * ((s.to_status = 'completed')::int - (s.from_status = 'completed')::int)) AS completed,
           sum(s.n * ((s.to_status = 'failed')::int - (s.from_status = 'failed')::int)) AS failed,
           sum(s.n * ((s.to_status = 'dead_letter')::int - (s.from_status = 'dead_letter')::int)) AS dead_letter
    FROM (SELECT partition_id, coalesce(from_status, '') AS from_status,
                 coalesce(to_status, '') AS to_status, n FROM queen.status_deltas) s
    GROUP BY s.partition_id
) d ON d.partition_id = p.id;
