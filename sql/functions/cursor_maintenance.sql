-- Time-driven work of the cursor store, run by maintenance.

-- End up to p_limit expired leases (oldest expiry first; those another session holds
-- are skipped): their un-acked messages become available again with retryCount + 1, or
-- are dead-lettered past the retry limit. Returns the number of leases ended.
CREATE OR REPLACE FUNCTION queen.cursor_expire_leases(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    expired record;
    ended   integer := 0;
BEGIN
    FOR expired IN
        SELECT c.partition_id, c.consumer_group FROM queen.cursor_consumers c
        WHERE c.lease_id IS NOT NULL AND c.lease_expires_at <= now()
        ORDER BY c.lease_expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    LOOP
        PERFORM queen.cursor_release(expired.partition_id, expired.consumer_group);
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
CREATE OR REPLACE FUNCTION queen.cursor_retention(p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    deleted integer;
BEGIN
    WITH doomed AS (
        SELECT m.partition_id, m.id
        FROM queen.queues q
        JOIN queen.partitions p ON p.queue_id = q.id
        CROSS JOIN LATERAL (
            SELECT min(c.cursor_id) AS passed FROM queen.cursor_consumers c
            WHERE c.partition_id = p.id
              AND (q.retention_seconds = 0
                   OR c.updated_at > now() - make_interval(secs => q.retention_seconds))) g
        JOIN queen.cursor_messages m ON m.partition_id = p.id
        WHERE q.retention_enabled
          AND ((q.retention_seconds > 0
                AND m.created_at < now() - make_interval(secs => q.retention_seconds))
               OR (q.completed_retention_seconds > 0 AND m.id <= coalesce(g.passed, 0)
                   AND m.created_at < now() - make_interval(secs => q.completed_retention_seconds)))
        ORDER BY m.partition_id, m.id
        LIMIT p_limit
    )
    DELETE FROM queen.cursor_messages m USING doomed d
    WHERE m.partition_id = d.partition_id AND m.id = d.id;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;

-- ANALYZE the cursor store's tables that changed by more than a tenth since their last
-- analysis (or were never analysed): plans stay index-driven on a server without
-- autovacuum. Returns the tables analysed.
CREATE OR REPLACE FUNCTION queen.cursor_analyze(p_min_changes bigint DEFAULT 1000)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    stale text;
    done  text[] := '{}';
BEGIN
    FOR stale IN
        SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
        WHERE s.schemaname = 'queen' AND s.relname LIKE 'cursor\_%'
          AND s.n_mod_since_analyze >= greatest(p_min_changes, c.reltuples / 10)
        ORDER BY s.relname
    LOOP
        EXECUTE format('ANALYZE queen.%I', stale);
        done := done || stale;
    END LOOP;
    RETURN done;
END
$$;
