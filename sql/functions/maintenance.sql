-- Time-driven work, run by the maintenance process: lease expiry, due wake-ups, ttl,
-- retention, partition cleanup, ANALYZE.

-- End up to p_limit expired leases (oldest expiry first; those another session holds
-- are skipped): their un-acked messages become available again with retryCount + 1, or
-- are dead-lettered past the retry limit. Returns the number of leases ended.
CREATE OR REPLACE FUNCTION queen.expire_leases(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    expired record;
    ended   integer := 0;
BEGIN
    FOR expired IN
        SELECT c.partition_id, c.consumer_group FROM queen.consumers c
        WHERE c.lease_id IS NOT NULL AND c.lease_expires_at <= now()
        ORDER BY c.lease_expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    LOOP
        PERFORM queen.release_expired(expired.partition_id, expired.consumer_group);
        ended := ended + 1;
    END LOOP;
    RETURN ended;
END
$$;

-- Retention of queues with retentionEnabled, up to p_limit messages per call: a message
-- older than retentionSeconds goes whatever its groups did with it; one older than
-- completedRetentionSeconds goes once every group of its queue is past it (a group
-- whose cursors have not moved for retentionSeconds no longer holds it back). Returns
-- the number deleted.
CREATE OR REPLACE FUNCTION queen.retention(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    deleted integer;
BEGIN
    WITH doomed AS (
        SELECT m.partition_id, m.id
        FROM queen.queues q
        JOIN queen.partitions p ON p.queue_id = q.id
        CROSS JOIN LATERAL (
            SELECT min(c.cursor_id) AS passed FROM queen.consumers c
            WHERE c.partition_id = p.id
              AND (q.retention_seconds = 0
                   OR c.updated_at > now() - make_interval(secs => q.retention_seconds))) g
        JOIN queen.messages m ON m.partition_id = p.id
        WHERE q.retention_enabled
          AND ((q.retention_seconds > 0
                AND m.created_at < now() - make_interval(secs => q.retention_seconds))
               OR (q.completed_retention_seconds > 0 AND m.id <= coalesce(g.passed, 0)
                   AND m.created_at < now() - make_interval(secs => q.completed_retention_seconds)))
        ORDER BY m.partition_id, m.id
        LIMIT p_limit
    )
    DELETE FROM queen.messages m USING doomed d
    WHERE m.partition_id = d.partition_id AND m.id = d.id;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;

-- ANALYZE the message tables and the partitions that changed by more than a tenth since
-- their last analysis (or were never analysed): plans stay index-driven on a server
-- without autovacuum (a queue's partitions read in index order by a pop: see
-- queen.candidates). Where autovacuum runs on a table it analyses it itself, at
-- a smaller change (0001_schema.sql's table settings), but at most once a minute
-- (autovacuum_naptime). Done here meanwhile: a table it has not analysed yet, and one
-- that holds more than twice the rows its statistics say (reltuples: -1 since a
-- TRUNCATE), since sessions keep the plans they made from those statistics (a probe of
-- a partition's next message planned as a sequential scan while the table was small
-- reads every message once it is not). Doubling bounds both how far a kept plan's
-- estimate can be off and how often a growing table is analysed.
-- Returns the tables analysed.
CREATE OR REPLACE FUNCTION queen.analyze_tables(p_min_changes bigint DEFAULT 1000)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    stale text;
    done  text[] := '{}';
BEGIN
    FOR stale IN
        SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
        WHERE s.schemaname = 'queen'
          AND s.relname IN ('messages', 'consumers', 'consumer_groups', 'failures', 'completions',
                            'partition_counts', 'metrics_minute', 'partitions')
          AND s.n_mod_since_analyze >= greatest(p_min_changes, c.reltuples / 10)
          AND (coalesce(s.last_analyze, s.last_autoanalyze) IS NULL
               OR s.n_live_tup > 2 * greatest(c.reltuples, 0)
               OR NOT queen.autovacuum_runs_on(c.reloptions))
        ORDER BY s.relname
    LOOP
        EXECUTE format('ANALYZE queen.%I', stale);
        done := done || stale;
    END LOOP;
    RETURN done;
END
$$;

-- Whether autovacuum looks at a table with these options (pg_class.reloptions).
CREATE OR REPLACE FUNCTION queen.autovacuum_runs_on(p_options text[]) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT current_setting('autovacuum')::boolean AND current_setting('track_counts')::boolean
           AND coalesce((SELECT bool_and(substr(o, 20)::boolean) FROM unnest(p_options) o
                         WHERE o LIKE 'autovacuum\_enabled=%'), true)
$$;

-- When a group's partition becomes poppable without any write to it: its retryDelay
-- ends (p_not_before), its next message past the cursor (p_cursor, p_done) is
-- delayedProcessing old, its newest message is windowBuffer old (what a pop checks,
-- queen.pop). NULL: nothing to wait for.
CREATE OR REPLACE FUNCTION queen.due_at(p_partition uuid, p_cursor bigint,
                                        p_done bigint[], p_not_before timestamptz,
                                        p_delay integer, p_window integer)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT greatest(
        p_not_before,
        CASE WHEN p_delay > 0 THEN
            (SELECT m.created_at FROM queen.messages m
             WHERE m.partition_id = p_partition AND m.id > p_cursor AND m.id <> ALL (p_done)
             ORDER BY m.id LIMIT 1) + make_interval(secs => p_delay) END,
        CASE WHEN p_window > 0 THEN
            (SELECT m.created_at FROM queen.messages m
             WHERE m.partition_id = p_partition AND m.id > p_cursor
             ORDER BY m.id DESC LIMIT 1) + make_interval(secs => p_window) END)
$$;

-- Wake polls for the partitions that became poppable after p_since (the scanned_at of
-- the previous call): retryDelay over, delayed or windowed messages due. Answers how
-- many were woken, the seconds until the next one is due (NULL: none waiting) and the
-- time of this scan.
CREATE OR REPLACE FUNCTION queen.wake_due(p_since timestamptz)
RETURNS TABLE (woken integer, next_due_in double precision, scanned_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    at       timestamptz := clock_timestamp();
    due      uuid[];
    next_due timestamptz;
BEGIN
    SELECT array_agg(DISTINCT t.partition_id) FILTER (WHERE t.due_at > p_since AND t.due_at <= at),
           min(t.due_at) FILTER (WHERE t.due_at > at)
    INTO due, next_due
    FROM (SELECT c.partition_id,
                 queen.due_at(c.partition_id, c.cursor_id, c.done_ids, c.not_before,
                              q.delayed_processing, q.window_buffer) AS due_at
          FROM queen.consumers c JOIN queen.queues q ON q.id = c.queue_id
          WHERE (c.not_before IS NOT NULL OR q.delayed_processing > 0 OR q.window_buffer > 0)
            AND (c.lease_id IS NULL OR c.lease_expires_at <= now())
          UNION ALL
          -- Partitions of timed queues no group has a cursor in yet: a poll may wait on
          -- them before any pop made one (pop by queue passes over an open window).
          SELECT p.id, queen.due_at(p.id, 0, '{}', NULL, q.delayed_processing,
                                    q.window_buffer)
          FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
          WHERE (q.delayed_processing > 0 OR q.window_buffer > 0)
            AND NOT EXISTS (SELECT 1 FROM queen.consumers c
                            WHERE c.partition_id = p.id)) t;
    IF due IS NOT NULL THEN
        PERFORM queen.wake(due);
    END IF;
    RETURN QUERY SELECT coalesce(cardinality(due), 0),
                        extract(epoch FROM next_due - at)::double precision, at;
END
$$;

-- End expired leases (queen.expire_leases) for maintenance: leases ended, the
-- messages they covered, seconds until the next lease expires.
CREATE OR REPLACE FUNCTION queen.expire(p_limit integer)
RETURNS TABLE (leases integer, messages integer, next_expiry_in double precision)
LANGUAGE plpgsql AS $$
DECLARE
    covered integer;
    ended   integer;
BEGIN
    SELECT coalesce(sum(e.lease_size - cardinality(e.lease_acked)), 0) INTO covered
    FROM (SELECT c.lease_size, c.lease_acked FROM queen.consumers c
          WHERE c.lease_id IS NOT NULL AND c.lease_expires_at <= now()
          ORDER BY c.lease_expires_at LIMIT p_limit) e;
    ended := queen.expire_leases(p_limit);
    RETURN QUERY  -- (a statement of its own: it sees the leases just ended)
    SELECT ended, covered,
           (SELECT extract(epoch FROM min(c.lease_expires_at) - clock_timestamp())::double precision
            FROM queen.consumers c WHERE c.lease_id IS NOT NULL);
END
$$;

-- Remove up to p_limit partitions that hold no message, no live
-- lease of any group, and saw no activity for p_idle_seconds (the consumer rows, counts
-- and minutes go with them by their keys; completion and failure records, which have
-- none, are deleted here). A partition a push holds the push lock of is passed over, and
-- the re-check runs after the locks (a push finding its partition gone makes it again).
CREATE OR REPLACE FUNCTION queen.cleanup_partitions(p_idle_seconds integer, p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    locked  uuid[];
    removed integer;
BEGIN
    SELECT array_agg(c.id) INTO locked FROM (
        SELECT p.id FROM queen.partitions p
        WHERE p.created_at < now() - make_interval(secs => p_idle_seconds)
          AND NOT EXISTS (SELECT 1 FROM queen.messages m WHERE m.partition_id = p.id)
          AND NOT EXISTS (SELECT 1 FROM queen.consumers c
                          WHERE c.partition_id = p.id
                            AND (c.lease_id IS NOT NULL
                                 OR c.updated_at >= now() - make_interval(secs => p_idle_seconds)))
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED) c;
    IF locked IS NULL THEN
        RETURN 0;
    END IF;
    -- A push holds its partitions' push locks until it commits (queen.push_targets):
    -- skip those; the delete, a later statement, sees what the pushes before stored.
    locked := ARRAY(SELECT x FROM unnest(locked) x
                    WHERE pg_try_advisory_xact_lock(queen.push_lock_key(x)));
    IF cardinality(locked) = 0 THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM queen.partitions p
        WHERE p.id = ANY (locked)
          AND NOT EXISTS (SELECT 1 FROM queen.messages m WHERE m.partition_id = p.id)
          AND NOT EXISTS (SELECT 1 FROM queen.consumers c
                          WHERE c.partition_id = p.id AND c.lease_id IS NOT NULL)
        RETURNING p.id
    ), completions AS (
        DELETE FROM queen.completions k USING gone WHERE k.partition_id = gone.id
    ), failures AS (
        DELETE FROM queen.failures f USING gone WHERE f.partition_id = gone.id
    )
    SELECT count(*) INTO removed FROM gone;
    RETURN removed;
END
$$;

-- Ttl without a pop: dead-letter ('ttl expired') the messages past each group's cursor
-- that are older than their queue's ttl, as a pop would (queen.expire_ttl), so
-- that reads show them dead-lettered though nobody pops. Queue mode gets its cursors
-- first (messages nobody popped yet expire too). Partitions under a lease (an expired
-- one: until the leases task ends it), or locked by a pop, are skipped; at most p_limit
-- messages a call, the oldest expiring cursor first. Returns how many.
CREATE OR REPLACE FUNCTION queen.maintain_ttl(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    q       record;
    c       record;
    expired integer := 0;
BEGIN
    FOR q IN SELECT x.id FROM queen.queues x
             JOIN queen.partitions p ON p.queue_id = x.id
             WHERE x.ttl > 0
               AND NOT EXISTS (SELECT 1 FROM queen.consumers k
                               WHERE k.partition_id = p.id AND k.consumer_group = '__queue__')
             GROUP BY x.id
    LOOP
        PERFORM queen.join_group(q.id, '__queue__', NULL, NULL);
        PERFORM queen.ensure_cursors(q.id, '__queue__');
    END LOOP;
    FOR c IN
        SELECT k.partition_id, k.consumer_group, x.ttl FROM queen.consumers k
        JOIN queen.queues x ON x.id = k.queue_id
        WHERE x.ttl > 0 AND k.lease_id IS NULL
          AND EXISTS (SELECT 1 FROM queen.messages m
                      WHERE m.partition_id = k.partition_id AND m.id > k.cursor_id
                        AND m.id <> ALL (k.done_ids)
                        AND m.created_at < now() - make_interval(secs => x.ttl))
        ORDER BY k.updated_at
        FOR UPDATE OF k SKIP LOCKED
    LOOP
        EXIT WHEN expired >= p_limit;
        expired := expired + queen.expire_ttl(c.partition_id, c.consumer_group, c.ttl,
                                              p_limit - expired);
    END LOOP;
    RETURN expired;
END
$$;
