-- Consumer groups: subscription at the first pop, listing, seek, delete. Queue mode is
-- the built-in group '__queue__'.

-- Register a group on a queue at its first pop (later modes are ignored): 'all' starts
-- at the oldest retained message, 'new' after what exists now, 'from' at p_from.
CREATE OR REPLACE FUNCTION queen.join_group(p_queue uuid, p_group text, p_mode text,
                                            p_from timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    mode text := CASE WHEN p_from IS NOT NULL THEN 'from' ELSE coalesce(p_mode, 'all') END;
BEGIN
    IF EXISTS (SELECT 1 FROM queen.consumer_groups g
               WHERE g.queue_id = p_queue AND g.consumer_group = p_group) THEN
        RETURN;
    END IF;
    INSERT INTO queen.consumer_groups (queue_id, consumer_group, subscription_mode, subscription_from)
    VALUES (p_queue, p_group, mode,
            CASE mode WHEN 'new' THEN now() WHEN 'from' THEN p_from END)
    ON CONFLICT DO NOTHING;
END
$$;

-- The highest id of a partition created before p_time (0: none), where a cursor starting
-- at p_time stands.
CREATE OR REPLACE FUNCTION queen.last_id_before(p_partition uuid, p_time timestamptz)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(m.id), 0) FROM queen.messages m
    WHERE m.partition_id = p_partition AND m.created_at < p_time
$$;

-- Give a group a cursor in each partition of a queue (or the one named) that has none
-- yet, where its subscription says. Partitions are taken by key (one named: a probe of
-- it, whatever the queue's width).
CREATE OR REPLACE FUNCTION queen.ensure_cursors(p_queue uuid, p_group text,
                                                p_partition uuid DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    wanted uuid[];
BEGIN
    wanted := CASE WHEN p_partition IS NOT NULL THEN ARRAY[p_partition]
                   ELSE ARRAY(SELECT p.id FROM queen.partitions p WHERE p.queue_id = p_queue) END;
    INSERT INTO queen.consumers (partition_id, consumer_group, queue_id, cursor_id)
    SELECT p.id, p_group, p.queue_id,
           CASE WHEN g.subscription_from IS NULL THEN 0
                ELSE queen.last_id_before(p.id, g.subscription_from) END
    FROM queen.partitions p
    JOIN queen.consumer_groups g ON g.queue_id = p.queue_id AND g.consumer_group = p_group
    WHERE p.id = ANY (wanted) AND p.queue_id = p_queue
      AND NOT EXISTS (SELECT 1 FROM queen.consumers c
                      WHERE c.partition_id = p.id AND c.consumer_group = p_group)
    ORDER BY p.id
    ON CONFLICT DO NOTHING;
END
$$;

-- The groups reading a queue (or every queue): partitions where they have a cursor,
-- messages not yet done for them in any partition (pending, including those leased;
-- where a group has no cursor yet, from where its subscription would start), and the age
-- of the oldest of those.
CREATE OR REPLACE FUNCTION queen.group_list(p_queue text DEFAULT NULL)
RETURNS TABLE (consumer_group text, queue text, subscription_mode text, partitions integer,
               pending bigint, lag_seconds double precision)
LANGUAGE sql STABLE AS $$
    SELECT g.consumer_group, q.name, g.subscription_mode, count(c.partition_id)::integer,
           coalesce(sum(n.pending), 0)::bigint,
           coalesce(extract(epoch FROM now() - min(n.oldest)), 0)::double precision
    FROM queen.consumer_groups g
    JOIN queen.queues q ON q.id = g.queue_id
    LEFT JOIN queen.partitions p ON p.queue_id = q.id
    LEFT JOIN queen.consumers c
           ON c.partition_id = p.id AND c.consumer_group = g.consumer_group
    LEFT JOIN LATERAL (
        SELECT count(*) AS pending, min(m.created_at) AS oldest
        FROM queen.messages m
        WHERE m.partition_id = p.id
          AND m.id > coalesce(c.cursor_id, CASE WHEN g.subscription_from IS NULL THEN 0
                                                ELSE queen.last_id_before(p.id, g.subscription_from) END)
          AND m.id <> ALL (coalesce(c.done_ids, '{}'))) n ON true
    WHERE p_queue IS NULL OR q.name = p_queue
    GROUP BY g.consumer_group, q.name, g.subscription_mode
    ORDER BY q.name, g.consumer_group
$$;

-- Move a group's cursors on a queue to the beginning, the end, or p_time ('time'); ends
-- its leases (their acks then answer lease_expired) and forgets its retry state. Returns
-- the number of partitions moved; NULL when the queue does not exist.
CREATE OR REPLACE FUNCTION queen.seek(p_queue text, p_group text, p_to text,
                                      p_time timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    target   uuid;
    moved    integer;
BEGIN
    SELECT q.id INTO target FROM queen.queues q WHERE q.name = p_queue;
    IF target IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM queen.join_group(target, p_group, 'all', NULL);
    PERFORM queen.ensure_cursors(target, p_group);
    IF p_group = '__queue__' THEN  -- queue mode's counts (partition_counts) follow its cursor
        PERFORM queen.counts_lock(ARRAY(
            SELECT c.partition_id FROM queen.consumers c
            WHERE c.queue_id = target AND c.consumer_group = p_group));
    END IF;
    UPDATE queen.consumers c SET
        cursor_id = CASE p_to WHEN 'beginning' THEN 0
                              WHEN 'end' THEN queen.last_id_before(c.partition_id, 'infinity')
                              ELSE queen.last_id_before(c.partition_id, p_time) END,
        done_ids = '{}', retried_max = 0, not_before = NULL,
        lease_id = NULL, leased_by = NULL, lease_expires_at = NULL, lease_last_id = NULL,
        lease_size = NULL, lease_digest = NULL, lease_acked = '{}', updated_at = now()
    WHERE c.queue_id = target AND c.consumer_group = p_group;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF p_group = '__queue__' THEN  -- moved back: what the counts held past it is forgotten
        PERFORM queen.counts_step_back(c.partition_id, c.cursor_id)
        FROM queen.consumers c WHERE c.queue_id = target AND c.consumer_group = p_group;
    END IF;
    RETURN moved;
END
$$;

-- Forget a group on a queue (cursors, failures, completions, subscription): its next pop
-- starts over as a new group. Returns the number of cursors dropped.
CREATE OR REPLACE FUNCTION queen.group_delete(p_queue text, p_group text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    dropped integer;
BEGIN
    WITH gone AS (
        DELETE FROM queen.consumers c
        USING queen.queues q
        WHERE q.name = p_queue AND c.queue_id = q.id AND c.consumer_group = p_group
        RETURNING c.partition_id
    ), failures AS (
        DELETE FROM queen.failures f USING gone
        WHERE f.partition_id = gone.partition_id AND f.consumer_group = p_group
    ), completions AS (
        DELETE FROM queen.completions k USING gone
        WHERE k.partition_id = gone.partition_id AND k.consumer_group = p_group
    )
    SELECT count(*) INTO dropped FROM gone;
    DELETE FROM queen.consumer_groups g USING queen.queues q
    WHERE q.name = p_queue AND g.queue_id = q.id AND g.consumer_group = p_group;
    RETURN dropped;
END
$$;

-- A group's backlog in one partition, bounded: the messages past p_after that are not in
-- p_done, counted up to p_cap (capped: the count stopped there), and when the oldest of
-- them was created. p_since (a group with no cursor in the partition yet, subscribed
-- 'new' or 'from'): only messages created at or after it count, among the first p_cap
-- past p_after. An ordered walk of the primary key with a LIMIT: O(min(backlog, p_cap)).
CREATE OR REPLACE FUNCTION queen.backlog(p_partition uuid, p_after bigint, p_done bigint[],
                                         p_cap integer, p_since timestamptz DEFAULT NULL)
RETURNS TABLE (pending integer, capped boolean, oldest timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT count(*) FILTER (WHERE p_since IS NULL OR w.created_at >= p_since)::integer,
           count(*) >= p_cap,
           min(w.created_at) FILTER (WHERE p_since IS NULL OR w.created_at >= p_since)
    FROM (SELECT m.created_at FROM queen.messages m
          WHERE m.partition_id = p_partition AND m.id > p_after AND m.id <> ALL (p_done)
          ORDER BY m.id LIMIT p_cap) w
$$;

-- Per partition of the queues a group reads (one queue, or every queue; one group, or
-- every group): its cursor, its backlog counted by queen.backlog, the age of its
-- oldest unacked message, and its lease. The request counts at most p_budget messages
-- in all, shared among its (group, partition) pairs, and at most p_cap (at least 10) a
-- pair. Partitions where the group has no cursor yet count from where its subscription
-- starts. Queue mode is '__queue__'.
CREATE OR REPLACE FUNCTION queen.group_partitions(p_queue text, p_group text,
                                                  p_cap integer, p_budget integer)
RETURNS TABLE (consumer_group text, queue text, subscription_mode text,
               subscription_from timestamptz, joined_at timestamptz, partition text,
               cursor_id bigint, pending integer, capped boolean, lag_seconds double precision,
               lease_id uuid, leased_by text, lease_expires_at timestamptz,
               lease_size integer, updated_at timestamptz)
LANGUAGE sql STABLE AS $$
    WITH pairs AS (
        SELECT g.consumer_group, g.subscription_mode, g.subscription_from, g.created_at,
               q.name AS queue, p.id AS partition_id, p.name AS partition
        FROM queen.consumer_groups g
        JOIN queen.queues q ON q.id = g.queue_id
        LEFT JOIN queen.partitions p ON p.queue_id = q.id
        WHERE (p_queue IS NULL OR q.name = p_queue)
          AND (p_group IS NULL OR g.consumer_group = p_group)
    ), share AS (
        SELECT least(p_cap, greatest(10, p_budget / greatest(count(*), 1)))::integer AS cap
        FROM pairs
    )
    SELECT x.consumer_group, x.queue, x.subscription_mode, x.subscription_from, x.created_at,
           x.partition, c.cursor_id, coalesce(b.pending, 0), coalesce(b.capped, false),
           coalesce(extract(epoch FROM now() - b.oldest), 0)::double precision,
           CASE WHEN c.lease_expires_at > now() THEN c.lease_id END,
           CASE WHEN c.lease_expires_at > now() THEN c.leased_by END,
           CASE WHEN c.lease_expires_at > now() THEN c.lease_expires_at END,
           CASE WHEN c.lease_expires_at > now() THEN c.lease_size END,
           c.updated_at
    FROM pairs x
    CROSS JOIN share s
    LEFT JOIN queen.consumers c
           ON c.partition_id = x.partition_id AND c.consumer_group = x.consumer_group
    LEFT JOIN LATERAL queen.backlog(
        x.partition_id, coalesce(c.cursor_id, 0), coalesce(c.done_ids, '{}'), s.cap,
        CASE WHEN c.partition_id IS NULL THEN x.subscription_from END) b
        ON x.partition_id IS NOT NULL
    ORDER BY x.queue, x.consumer_group, x.partition
$$;

-- The groups reading a queue (or every queue), or one group: what
-- queen.group_partitions says per partition, summed per (group, queue).
CREATE OR REPLACE FUNCTION queen.group_summaries(p_queue text, p_group text,
                                                 p_cap integer, p_budget integer)
RETURNS TABLE (consumer_group text, queue text, subscription_mode text,
               subscription_from timestamptz, joined_at timestamptz, partitions integer,
               leased integer, pending bigint, capped boolean, lag_seconds double precision)
LANGUAGE sql STABLE AS $$
    SELECT s.consumer_group, s.queue, s.subscription_mode, s.subscription_from, s.joined_at,
           count(s.cursor_id)::integer, count(s.lease_id)::integer,
           sum(s.pending)::bigint, bool_or(s.capped), max(s.lag_seconds)
    FROM queen.group_partitions(p_queue, p_group, p_cap, p_budget) s
    GROUP BY 1, 2, 3, 4, 5
    ORDER BY s.queue, s.consumer_group
$$;
