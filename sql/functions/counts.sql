-- Rollups for the read endpoints, kept by maintenance: queue mode's counts per
-- partition (queen.partition_counts) and activity per minute (queen.metrics_minute),
-- with its lag histograms. Each step walks only what arrived or was consumed since the
-- last one, from a watermark, a bounded number of messages at a time.

-- (Builds of one day walked the passed window by these; the walks below cost less CPU.)
DROP FUNCTION IF EXISTS queen.window_ends(uuid, bigint, bigint[], timestamptz[]);
DROP FUNCTION IF EXISTS queen.window_ends(uuid, bigint, bigint);
-- (Builds before the arrivals were counted in the passed window's walk: the arrivals'
-- own walk, and the passed window's without p_counted.)
DROP FUNCTION IF EXISTS queen.arrived(uuid, bigint, integer);
DROP FUNCTION IF EXISTS queen.passed_ends(uuid, bigint, bigint, integer);

-- Bucket of a created -> completed time (ms) in the lag histograms (64 buckets).
CREATE OR REPLACE FUNCTION queen.lag_bucket(p_ms double precision) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_ms < 1 THEN 0 ELSE least(63, floor(2 * ln(p_ms) / ln(2)))::integer END
$$;

-- Add two lag histograms (element by element; NULL counts as empty). (PL/pgSQL: as a SQL
-- function it would need a subquery, which is never inlined, and a SQL function that is
-- not is parsed and planned again in every statement that calls it.)
CREATE OR REPLACE FUNCTION queen.hist_add(a integer[], b integer[]) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    total integer[] := '{}';
BEGIN
    FOR i IN 1..coalesce(greatest(cardinality(a), cardinality(b)), 0) LOOP
        total[i] := coalesce(a[i], 0) + coalesce(b[i], 0);
    END LOOP;
    RETURN total;
END
$$;

-- The sum of lag histograms (NULL counts as empty).
CREATE OR REPLACE AGGREGATE queen.hist_sum(integer[]) (
    SFUNC = queen.hist_add, STYPE = integer[]
);

-- What queue mode's cursor passed from p_after to p_upto (up to p_step messages, in id
-- order), in groups of n messages that ended alike: completed (final NULL) at the time
-- of the ack that completed them, ms from push to ack; or failed / dead_letter at the
-- time of their failure record. A message's ack is the completion with the lowest
-- last_id at or above its id (when that one's first_id is not above it; none: at now()).
-- So the window is cut at the completions' last ids into spans, each one completion's,
-- and each span's messages are grouped by their push (one created_at): a range scan per
-- completion, no lookup per message. A message with a failure record is counted in its
-- span's group like the others, then taken out of it (n -1) and counted as failed:
-- failure records are few, and a walk with none reads none of them.
-- With p_counted, the window's messages after it are also counted as arrivals (final
-- 'arrived', at the minute they were pushed; reached: the highest id), so that the
-- arrivals' own walk (queen.activity_walk) need not read them again. A window no wider
-- in ids than p_step holds no more messages than that (ids are unique): it is walked
-- whole, with no walk first to find where a step ends.
CREATE OR REPLACE FUNCTION queen.passed_ends(p_partition uuid, p_after bigint,
                                             p_upto bigint, p_step integer,
                                             p_counted bigint DEFAULT NULL)
RETURNS TABLE (minute timestamptz, final text, ms double precision, n bigint, reached bigint)
LANGUAGE sql STABLE AS $$
    WITH bound AS MATERIALIZED (  -- the window's last message, or an id past it
        SELECT CASE WHEN p_upto - p_after <= p_step THEN p_upto ELSE coalesce(
            (SELECT m.id FROM queen.messages m
             WHERE m.partition_id = p_partition AND m.id > p_after AND m.id <= p_upto
             ORDER BY m.id OFFSET p_step - 1 LIMIT 1),
            (SELECT max(m.id) FROM queen.messages m
             WHERE m.partition_id = p_partition AND m.id > p_after AND m.id <= p_upto)) END
            AS last
    ), acks AS MATERIALIZED (  -- the completions ending inside the window, and the next one
        SELECT c.first_id, c.last_id, c.acked_at FROM queen.completions c, bound b
        WHERE c.partition_id = p_partition AND c.consumer_group = '__queue__'
          AND c.last_id > p_after AND c.last_id < b.last
        UNION ALL
        -- (A probe of the key from the bound: as a join, the plan may read the
        -- partition's completions from its first one up to the bound.)
        SELECT c.first_id, c.last_id, c.acked_at FROM bound b
        CROSS JOIN LATERAL (SELECT c.first_id, c.last_id, c.acked_at FROM queen.completions c
                            WHERE c.partition_id = p_partition
                              AND c.consumer_group = '__queue__' AND c.last_id >= b.last
                            ORDER BY c.last_id LIMIT 1) c
    ), spans AS MATERIALIZED (  -- (lo, hi]: one completion's; past the last one, none's
        SELECT lag(a.last_id, 1, p_after) OVER (ORDER BY a.last_id) AS lo,
               least(a.last_id, b.last) AS hi, a.first_id, a.acked_at
        FROM acks a, bound b
        UNION ALL
        SELECT coalesce(max(a.last_id), p_after), b.last, NULL, NULL
        FROM bound b LEFT JOIN acks a ON true
        GROUP BY b.last HAVING coalesce(max(a.last_id), p_after) < b.last
    ), groups AS (
        SELECT CASE WHEN m.id >= s.first_id THEN s.acked_at END AS acked_at, m.created_at,
               count(*) AS n, max(m.id) AS reached,
               count(*) FILTER (WHERE m.id > p_counted) AS arrived,
               max(m.id) FILTER (WHERE m.id > p_counted) AS newest
        FROM spans s
        -- (LIMIT: a scan of the key per span; as a join, the planner may compare every
        -- message of the window with every span.)
        CROSS JOIN LATERAL (SELECT m.id, m.created_at FROM queen.messages m
                            WHERE m.partition_id = p_partition AND m.id > s.lo
                              AND m.id <= s.hi
                            LIMIT p_step) m
        GROUP BY 1, 2
    ), failed AS (  -- the final failure records of the window's messages, in their spans
        SELECT f.message_id, f.status, f.failed_at, m.created_at,
               CASE WHEN f.message_id >= s.first_id THEN s.acked_at END AS acked_at
        FROM bound b
        JOIN queen.failures f
          ON f.partition_id = p_partition AND f.consumer_group = '__queue__'
         AND f.message_id > p_after AND f.message_id <= b.last AND f.status <> 'retry'
        JOIN queen.messages m ON m.partition_id = p_partition AND m.id = f.message_id
        JOIN spans s ON f.message_id > s.lo AND f.message_id <= s.hi
    ), ends AS (
        SELECT g.acked_at, g.created_at, NULL::text AS final, g.n, g.reached FROM groups g
        UNION ALL
        SELECT x.acked_at, x.created_at, NULL, -1, NULL FROM failed x
        UNION ALL
        SELECT x.failed_at, NULL, x.status, 1, x.message_id FROM failed x
        UNION ALL
        SELECT NULL, date_trunc('minute', g.created_at), 'arrived', sum(g.arrived),
               max(g.newest)
        FROM groups g WHERE g.arrived > 0 GROUP BY 2
    )
    SELECT date_trunc('minute', CASE WHEN e.final = 'arrived' THEN e.created_at
                                     ELSE coalesce(e.acked_at, now()) END),
           e.final,
           CASE WHEN e.final IS NULL THEN
               greatest(extract(epoch FROM coalesce(e.acked_at, now()) - e.created_at) * 1000, 0)
           END,
           sum(e.n)::bigint, max(e.reached)
    FROM ends e
    GROUP BY e.acked_at, e.created_at, e.final
    HAVING sum(e.n) > 0
$$;

-- Activity per minute of a partition past its watermarks (p_counted: arrivals counted
-- up to there; p_cursor_counted: the cursor's last counted position; p_cursor: where it
-- stands), with the highest id counted in that minute (newest: arrived; reached: passed).
-- The passed window is walked up to p_step messages (queen.passed_ends); when it starts
-- at or below p_counted, its messages after p_counted are counted as arrivals there, and
-- the arrivals' own walk goes on from the last of them, up to p_step more: each message
-- is read once for both where the cursor follows the pushes closely. The arrivals' walk
-- groups its messages by their push time before it takes their minute (a push's messages
-- share one: a minute computed a message cost a third of the walk). Maintenance adds
-- this to queen.metrics_minute and moves the watermarks; reads add it to what
-- maintenance added.
CREATE OR REPLACE FUNCTION queen.activity_walk(p_partition uuid, p_counted bigint,
                                               p_cursor_counted bigint, p_cursor bigint,
                                               p_step integer)
RETURNS TABLE (minute timestamptz, incoming bigint, completed bigint, failed bigint,
               dead_letter bigint, lag_ms bigint, lag_hist integer[], newest bigint,
               reached bigint)
LANGUAGE sql STABLE AS $$
    WITH walked AS MATERIALIZED (
        SELECT x.* FROM queen.passed_ends(p_partition, p_cursor_counted, p_cursor, p_step,
                                          CASE WHEN p_cursor_counted <= p_counted
                                               THEN p_counted END) x
    ), ends AS (  -- one row per minute and lag bucket (NULL: failures)
        SELECT x.minute,
               CASE WHEN x.final IS NULL THEN queen.lag_bucket(x.ms) END AS bucket,
               sum(x.n) FILTER (WHERE x.final IS NULL) AS completed,
               sum(x.n) FILTER (WHERE x.final = 'failed') AS failed,
               sum(x.n) FILTER (WHERE x.final = 'dead_letter') AS dead_letter,
               sum(x.ms * x.n) FILTER (WHERE x.final IS NULL) AS lag_ms,
               max(x.reached) AS reached
        FROM walked x WHERE x.final IS DISTINCT FROM 'arrived'
        GROUP BY 1, 2
    ), passed AS (
        SELECT e.minute, sum(e.completed) AS completed, sum(e.failed) AS failed,
               sum(e.dead_letter) AS dead_letter, coalesce(sum(e.lag_ms), 0) AS lag_ms,
               ARRAY(SELECT coalesce(b.completed, 0)::integer FROM generate_series(0, 63) i
                     LEFT JOIN ends b ON b.minute = e.minute AND b.bucket = i
                     ORDER BY i) AS lag_hist,
               max(e.reached) AS reached
        FROM ends e GROUP BY e.minute
    ), arrived AS (
        SELECT a.minute, sum(a.n) AS incoming, max(a.id) AS newest
        FROM (SELECT x.minute, x.n, x.reached AS id FROM walked x WHERE x.final = 'arrived'
              UNION ALL
              SELECT date_trunc('minute', g.created_at), g.n, g.id
              FROM (SELECT m.created_at, count(*) AS n, max(m.id) AS id  -- (a push's alike)
                    FROM (SELECT greatest(p_counted, max(x.reached)) AS after FROM walked x
                          WHERE x.final = 'arrived') s
                    CROSS JOIN LATERAL (SELECT m.id, m.created_at FROM queen.messages m
                                        WHERE m.partition_id = p_partition
                                          AND m.id > coalesce(s.after, p_counted)
                                        ORDER BY m.id LIMIT p_step) m
                    GROUP BY m.created_at) g) a
        GROUP BY a.minute
    )
    SELECT coalesce(a.minute, x.minute), coalesce(a.incoming, 0),
           coalesce(x.completed, 0)::bigint, coalesce(x.failed, 0)::bigint,
           coalesce(x.dead_letter, 0)::bigint, coalesce(x.lag_ms, 0)::bigint,
           coalesce(x.lag_hist, array_fill(0, ARRAY[64])), a.newest, x.reached
    FROM arrived a FULL JOIN passed x ON x.minute = a.minute
$$;

-- Move a partition's cursor watermark back to p_to (its count row locked by the caller):
-- what it counted above p_to is forgotten. Whoever moves queue mode's cursor back (a
-- retry in place, a seek) calls it, in the same transaction: a cursor that moved back and
-- forward again between two refreshes would otherwise leave the failure records written
-- meanwhile below the watermark uncounted.
CREATE OR REPLACE FUNCTION queen.counts_step_back(p_partition uuid, p_to bigint)
RETURNS void
LANGUAGE sql AS $$
    UPDATE queen.partition_counts k SET
        below = k.below - queen.count_range(p_partition, p_to, k.cursor_counted,
                                            2147483647),
        failed = k.failed - (SELECT count(*) FROM queen.failures f
                             WHERE f.partition_id = p_partition AND f.consumer_group = '__queue__'
                               AND f.message_id > p_to AND f.message_id <= k.cursor_counted
                               AND f.status = 'failed'),
        dead_letter = k.dead_letter - (SELECT count(*) FROM queen.failures f
                             WHERE f.partition_id = p_partition AND f.consumer_group = '__queue__'
                               AND f.message_id > p_to AND f.message_id <= k.cursor_counted
                               AND f.status = 'dead_letter'),
        cursor_counted = p_to
    WHERE k.partition_id = p_partition AND p_to < k.cursor_counted
$$;

-- Bring a partition's count row and activity up to date by at most p_step messages each
-- way (new messages; messages queue mode's cursor passed, or left behind when it moved
-- back). Returns whether it is caught up.
CREATE OR REPLACE FUNCTION queen.count_partition(p_partition uuid, p_step integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    k       queen.partition_counts;
    target  bigint;
    arrived bigint;
    newest  bigint;
    passed  bigint;
    reached bigint;
    n_failed bigint;
    n_dead  bigint;
BEGIN
    INSERT INTO queen.partition_counts (partition_id) VALUES (p_partition) ON CONFLICT DO NOTHING;
    -- Locked first: the statements below see every delete that committed before (the
    -- delete trigger waits for this lock, and adjusts what is counted by then).
    SELECT * INTO k FROM queen.partition_counts x WHERE x.partition_id = p_partition FOR UPDATE;
    target := coalesce((SELECT c.cursor_id FROM queen.consumers c
                        WHERE c.partition_id = p_partition AND c.consumer_group = '__queue__'), 0);
    WITH walk AS MATERIALIZED (
        SELECT * FROM queen.activity_walk(p_partition, k.counted_id, k.cursor_counted,
                                          target, p_step)
    ), added AS (
        INSERT INTO queen.metrics_minute AS t
            (minute, partition_id, incoming, completed, failed, dead_letter, lag_ms, lag_hist)
        SELECT a.minute, p_partition, a.incoming, a.completed, a.failed, a.dead_letter,
               a.lag_ms, a.lag_hist
        FROM walk a
        ON CONFLICT (minute, partition_id) DO UPDATE SET
            incoming = t.incoming + EXCLUDED.incoming,
            completed = t.completed + EXCLUDED.completed,
            failed = t.failed + EXCLUDED.failed,
            dead_letter = t.dead_letter + EXCLUDED.dead_letter,
            lag_ms = t.lag_ms + EXCLUDED.lag_ms,
            lag_hist = queen.hist_add(t.lag_hist, EXCLUDED.lag_hist)
    )
    SELECT coalesce(sum(a.incoming), 0), max(a.newest),
           coalesce(sum(a.completed + a.failed + a.dead_letter), 0), max(a.reached),
           coalesce(sum(a.failed), 0), coalesce(sum(a.dead_letter), 0)
    INTO arrived, newest, passed, reached, n_failed, n_dead
    FROM walk a;
    IF target < k.cursor_counted THEN  -- moved back (a seek): forget what it left
        PERFORM queen.counts_step_back(p_partition, target);
        passed := 0;
        n_failed := 0;
        n_dead := 0;
        reached := target;
    ELSIF passed < p_step THEN
        reached := target;
    END IF;
    UPDATE queen.partition_counts x SET
        counted_id = coalesce(newest, x.counted_id), total = x.total + arrived,
        cursor_counted = coalesce(reached, x.cursor_counted), below = x.below + passed,
        failed = x.failed + n_failed, dead_letter = x.dead_letter + n_dead,
        refreshed_at = now(),
        -- (not from the first refresh: its arrivals may start anywhere past id 0)
        share = CASE WHEN arrived > 0 AND k.counted_id > 0 AND newest > k.counted_id
                     THEN arrived::real / (newest - k.counted_id) ELSE x.share END
    WHERE x.partition_id = p_partition;
    -- (Arrivals counted in the passed window come on top of their own walk's p_step.
    -- The probe is ordered by the key: as an EXISTS, a generic plan may scan the table.)
    RETURN (arrived < p_step
            OR (SELECT m.id FROM queen.messages m
                WHERE m.partition_id = p_partition AND m.id > coalesce(newest, k.counted_id)
                ORDER BY m.id LIMIT 1) IS NULL)
       AND coalesce(reached, k.cursor_counted) >= target;
END
$$;

-- One maintenance step: refresh the count rows of up to p_partitions partitions with
-- something new to count (messages past counted_id, or queue mode's cursor elsewhere
-- than cursor_counted), those refreshed longest ago first, by at most p_step messages
-- each. Returns how many are not caught up yet (run again soon when some are). A
-- partition with nothing new costs two key probes and no write: refreshing every
-- partition every cycle rewrote each count row (and walked nothing) once a second,
-- which at a low message rate was a large share of PostgreSQL's work per message.
-- Its statements and those of the functions it calls keep one plan per session
-- (plan_cache_mode), as the hot path's: PL/pgSQL would plan the walk
-- (queen.activity_walk, inlined) afresh for every partition, which costs more than the
-- walk itself.
CREATE OR REPLACE FUNCTION queen.count_refresh(p_partitions integer, p_step integer)
RETURNS integer
LANGUAGE sql AS $$
    SELECT queen.count_refresh(p_partitions, p_step, 0, 0)
$$;

-- As above, but a partition refreshed less than p_settle seconds ago waits for its next
-- turn unless more than about p_lag messages arrived or were passed since: a refresh
-- costs a partition about as much for one new message as for dozens, so a partition that
-- moves slowly is refreshed every p_settle seconds, and one that moves fast as often as
-- before (the reads count what lies past the watermarks themselves, exact either way).
-- How many is estimated, not walked: the ids drawn since (past its counted_id, or
-- between its cursor's two places) times the share of them its last refresh found it
-- got (partition_counts.share; unknown: every one), where a walk of up to p_lag
-- messages of every partition at every step would fetch each message several times. A
-- partition whose share grew since waits at most p_settle seconds.
CREATE OR REPLACE FUNCTION queen.count_refresh(p_partitions integer, p_step integer,
                                               p_settle double precision, p_lag integer)
RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    picked uuid;
    behind integer := 0;
BEGIN
    FOR picked IN
        SELECT p.id FROM queen.partitions p
        LEFT JOIN queen.partition_counts k ON k.partition_id = p.id
        CROSS JOIN LATERAL (
            SELECT coalesce((SELECT c.cursor_id FROM queen.consumers c
                             WHERE c.partition_id = p.id
                               AND c.consumer_group = '__queue__'), 0) AS cursor,
                   coalesce((SELECT m.id FROM queen.messages m WHERE m.partition_id = p.id
                             ORDER BY m.id DESC LIMIT 1), 0) AS newest) c
        WHERE k.partition_id IS NULL
           OR ((c.cursor <> k.cursor_counted OR c.newest > k.counted_id)
               AND (k.refreshed_at <= now() - make_interval(secs => p_settle)
                    OR (c.newest - k.counted_id) * coalesce(k.share, 1) > p_lag
                    OR abs(c.cursor - k.cursor_counted) * coalesce(k.share, 1) > p_lag))
        ORDER BY k.refreshed_at NULLS FIRST, p.id
        LIMIT p_partitions
    LOOP
        IF NOT queen.count_partition(picked, p_step) THEN
            behind := behind + 1;
        END IF;
    END LOOP;
    RETURN behind;
END
$$;

-- Delete per-minute activity older than p_days, at most p_limit rows; returns how many.
CREATE OR REPLACE FUNCTION queen.metrics_prune(p_days integer, p_limit integer)
RETURNS integer
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM queen.metrics_minute m
        USING (SELECT minute, partition_id FROM queen.metrics_minute
               WHERE minute < date_trunc('minute', now()) - make_interval(days => p_days)
               ORDER BY minute LIMIT p_limit) old
        WHERE m.minute = old.minute AND m.partition_id = old.partition_id
        RETURNING 1
    )
    SELECT count(*)::integer FROM gone
$$;

-- Make sure partitions have count rows, and lock them (in order) for a change of what
-- they count: one a refresh is creating is waited for, not missed.
CREATE OR REPLACE FUNCTION queen.counts_lock(p_partitions uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO queen.partition_counts (partition_id)
    SELECT p.id FROM queen.partitions p WHERE p.id = ANY (p_partitions) ORDER BY p.id
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM queen.partition_counts k WHERE k.partition_id = ANY (p_partitions)
    ORDER BY k.partition_id FOR UPDATE;
END
$$;

-- After a delete of messages: their failure records go (nothing can act on them any
-- more), and the counts forget those they held. Locks the count rows first, in order,
-- so that a refresh running meanwhile is seen whole. The completions that covered only
-- deleted messages go too (every read of one starts from a message): a partition's ack
-- history would otherwise grow for as long as the partition lives.
CREATE OR REPLACE FUNCTION queen.messages_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    recorded boolean;  -- whether the partitions have failure records at all
BEGIN
    recorded := EXISTS (SELECT 1 FROM (SELECT DISTINCT g.partition_id FROM gone g) g
                        WHERE EXISTS (SELECT 1 FROM queen.failures f
                                      WHERE f.partition_id = g.partition_id));
    PERFORM queen.counts_lock(ARRAY(SELECT DISTINCT g.partition_id FROM gone g));
    WITH dropped AS (
        DELETE FROM queen.failures f
        USING gone g, queen.consumers c
        WHERE recorded AND c.partition_id = g.partition_id AND f.partition_id = g.partition_id
          AND f.consumer_group = c.consumer_group AND f.message_id = g.id
        RETURNING f.partition_id, f.consumer_group, f.message_id, f.status
    ), messages AS (
        SELECT g.partition_id, count(*) FILTER (WHERE g.id <= k.counted_id) AS total,
               count(*) FILTER (WHERE g.id <= k.cursor_counted) AS below
        FROM gone g JOIN queen.partition_counts k ON k.partition_id = g.partition_id
        GROUP BY g.partition_id
    ), failures AS (
        SELECT d.partition_id, count(*) FILTER (WHERE d.status = 'failed') AS failed,
               count(*) FILTER (WHERE d.status = 'dead_letter') AS dead_letter
        FROM dropped d JOIN queen.partition_counts k ON k.partition_id = d.partition_id
        WHERE d.consumer_group = '__queue__' AND d.message_id <= k.cursor_counted
        GROUP BY d.partition_id
    )
    UPDATE queen.partition_counts k SET
        total = k.total - m.total, below = k.below - m.below,
        failed = k.failed - coalesce(f.failed, 0),
        dead_letter = k.dead_letter - coalesce(f.dead_letter, 0)
    FROM messages m LEFT JOIN failures f ON f.partition_id = m.partition_id
    WHERE k.partition_id = m.partition_id;
    -- A cursor row naming a deleted message as the next past its cursor knows it no more.
    -- (One another transaction holds is passed over, not waited for: whoever holds a
    -- consumer row may wait for the count rows locked above. A pop that finds such a
    -- partition empty forgets it then: queen.pop.)
    UPDATE queen.consumers c SET next_id = NULL, next_after = NULL
    WHERE c.ctid = ANY (ARRAY(
        SELECT x.ctid
        FROM (SELECT g.partition_id, min(g.id) AS lo, max(g.id) AS hi
              FROM gone g GROUP BY g.partition_id) d
        JOIN queen.consumers x
          ON x.partition_id = d.partition_id AND x.next_id BETWEEN d.lo AND d.hi
        FOR UPDATE OF x SKIP LOCKED));
    -- (Below the oldest message left, and not past the last deleted: a push committing
    -- meanwhile draws ids above both. At most as many a partition as messages went, and
    -- 10,000 more: a history left from before is taken a delete at a time, not at once.)
    DELETE FROM queen.completions k
    WHERE k.ctid = ANY (ARRAY(
        SELECT c.ctid
        FROM (SELECT g.partition_id, max(g.id) AS last, count(*) AS n,
                     (SELECT m.id FROM queen.messages m
                      WHERE m.partition_id = g.partition_id
                      ORDER BY m.id LIMIT 1) AS oldest
              FROM gone g GROUP BY g.partition_id) d
        CROSS JOIN LATERAL (SELECT c.ctid FROM queen.completions c
                            WHERE c.partition_id = d.partition_id AND c.last_id <= d.last
                              AND (d.oldest IS NULL OR c.last_id < d.oldest)
                            LIMIT d.n + 10000) c));
    RETURN NULL;
END
$$;
