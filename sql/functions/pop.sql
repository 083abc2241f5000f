-- Pops: lease a partition for a group and read the messages after its cursor, in order;
-- by partition, by queue, by namespace/task, and in the API's shape (queen.popped).

-- The first message past a cursor row's cursor as the row keeps it (consumers.next_id),
-- or NULL where it keeps none for that cursor (the cursor moved another way since, or the
-- ack found none): a ranking probes the partition's key then.
CREATE OR REPLACE FUNCTION queen.kept_next(p_cursor bigint, p_next bigint, p_after bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_after = p_cursor THEN p_next END
$$;

-- Dead-letter the leading messages past a group's cursor that are older than the queue's
-- ttl (never delivered: error 'ttl expired'), up to p_limit of them; the caller holds the
-- group's row lock. Returns how many.
CREATE OR REPLACE FUNCTION queen.expire_ttl(p_partition uuid, p_group text, p_ttl integer,
                                            p_limit integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    c       queen.consumers;
    expired bigint[];
BEGIN
    SELECT * INTO c FROM queen.consumers x
    WHERE x.partition_id = p_partition AND x.consumer_group = p_group;
    expired := ARRAY(
        SELECT n.id FROM (
            SELECT h.id, bool_and(h.created_at < now() - make_interval(secs => p_ttl))
                             OVER (ORDER BY h.id) AS old
            FROM (SELECT m.id, m.created_at FROM queen.messages m
                  WHERE m.partition_id = p_partition AND m.id > c.cursor_id
                    AND m.id <> ALL (c.done_ids)
                  ORDER BY m.id LIMIT p_limit) h) n
        WHERE n.old ORDER BY n.id);
    IF cardinality(expired) > 0 THEN
        INSERT INTO queen.failures AS f
            (partition_id, consumer_group, message_id, status, retry_count, error)
        SELECT p_partition, p_group, e, 'dead_letter',
               queen.retries_of(p_partition, p_group, e, c.retried_max), 'ttl expired'
        FROM unnest(expired) e ORDER BY e
        ON CONFLICT (partition_id, consumer_group, message_id) DO UPDATE
        SET status = 'dead_letter', error = 'ttl expired', failed_at = now();
        PERFORM queen.settle(p_partition, p_group, expired, '{}', NULL);
    END IF;
    RETURN cardinality(expired);
END
$$;

-- The rare steps before a claim of a group's partition (its row locked by the caller, its
-- lease not live, not held back): an expired lease (p_expired) is ended first, which may
-- start retryDelay; a partition whose window (p_window, windowBuffer) is open is passed
-- over; messages past the ttl (p_ttl) are dead-lettered, a batch's worth at a time while
-- whole batches expire. Returns whether the claim may go on.
CREATE OR REPLACE FUNCTION queen.claimable(p_partition uuid, p_group text,
                                           p_expired boolean, p_window integer,
                                           p_ttl integer, p_batch integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_expired THEN
        PERFORM queen.release_expired(p_partition, p_group);
        IF EXISTS (SELECT 1 FROM queen.consumers x
                   WHERE x.partition_id = p_partition AND x.consumer_group = p_group
                     AND x.not_before > now()) THEN
            RETURN false;
        END IF;
    END IF;
    IF p_window > 0 AND (SELECT m.created_at FROM queen.messages m
                         WHERE m.partition_id = p_partition
                         ORDER BY m.id DESC LIMIT 1)
                        > now() - make_interval(secs => p_window) THEN
        RETURN false;
    END IF;
    IF p_ttl > 0 THEN
        FOR pass IN 1..10 LOOP
            EXIT WHEN queen.expire_ttl(p_partition, p_group, p_ttl, p_batch) < p_batch;
        END LOOP;
    END IF;
    RETURN true;
END
$$;

-- Partitions of a queue a group may pop now (no live lease, not held back, no window
-- open), up to p_limit, those with the oldest next message first. A queue of up to 256
-- partitions has them all ranked (one probe each). A wider one is walked in id order
-- from a random point on (wrapping around), one key probe a step, and the first p_limit
-- free ones with work among the first 256 walked are ranked: a pop reads a bounded
-- number of partitions however many the queue has, and the random start spreads the pops
-- over all of them (none waits behind others refilled faster than they are drained).
-- Only when those 256 hold none are all the queue's partitions ranked (as when most are
-- leased or drained). A partition where the group has no cursor yet counts from its first
-- message. Partitions whose window (windowBuffer) is still open are passed over, as the
-- claim would, so that they do not use up the candidates and hide one whose window
-- closed; an expired lease is a candidate whatever the window (the claim ends it).
-- (PL/pgSQL: a volatile SQL function would be planned again at every call.)
-- q: the queue's row, as the pop read it.
CREATE OR REPLACE FUNCTION queen.candidates(q queen.queues, p_group text, p_limit integer)
RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    p_queue uuid := q.id;
    start   uuid := gen_random_uuid();
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.queue_id = p_queue
                   ORDER BY p.id OFFSET 256 LIMIT 1) THEN  -- (in index order: it stops there)
        RETURN QUERY SELECT x FROM queen.rank_partitions(q, p_group, p_limit) x;
        RETURN;
    END IF;
    -- The walk: a recursive step per partition, each an index probe for the next id (so
    -- no statistics can turn it into a sort of the whole queue); then the partition's
    -- cursor and next message, probed by key (the next message read from the cursor row
    -- where an ack kept it), and queen.rank_partitions's conditions.
    RETURN QUERY
    WITH RECURSIVE walk (id, lap) AS (
        SELECT f.id, f.lap FROM (
            (SELECT p.id, 0 AS lap FROM queen.partitions p
             WHERE p.queue_id = p_queue AND p.id >= start ORDER BY p.id LIMIT 1)
            UNION ALL
            (SELECT p.id, 1 FROM queen.partitions p
             WHERE p.queue_id = p_queue AND p.id < start ORDER BY p.id LIMIT 1)
            LIMIT 1) f
        UNION ALL
        SELECT n.id, n.lap FROM walk w CROSS JOIN LATERAL (
            (SELECT p.id, 0 AS lap FROM queen.partitions p  -- on from the start
             WHERE w.lap = 0 AND p.queue_id = p_queue AND p.id > w.id ORDER BY p.id LIMIT 1)
            UNION ALL
            (SELECT p.id, 1 FROM queen.partitions p  -- past the last: round to the first
             WHERE w.lap = 0 AND p.queue_id = p_queue AND p.id < start ORDER BY p.id LIMIT 1)
            UNION ALL
            (SELECT p.id, 1 FROM queen.partitions p  -- on, up to the start
             WHERE w.lap = 1 AND p.queue_id = p_queue AND p.id > w.id AND p.id < start
             ORDER BY p.id LIMIT 1)
            LIMIT 1) n
    )
    SELECT w.id FROM (
        SELECT p.id, coalesce(queen.kept_next(c.cursor_id, c.next_id, c.next_after), m.id)
                       AS next_id
        FROM (SELECT * FROM walk LIMIT 256) p
        LEFT JOIN LATERAL (SELECT c.cursor_id, c.lease_id, c.lease_expires_at, c.not_before,
                                  c.next_id, c.next_after
                           FROM queen.consumers c
                           WHERE c.partition_id = p.id AND c.consumer_group = p_group
                           LIMIT 1) c ON true
        LEFT JOIN LATERAL (SELECT m.id FROM queen.messages m
                           WHERE m.partition_id = p.id AND m.id > coalesce(c.cursor_id, 0)
                             AND queen.kept_next(c.cursor_id, c.next_id, c.next_after) IS NULL
                           ORDER BY m.id LIMIT 1) m ON true
        WHERE coalesce(queen.kept_next(c.cursor_id, c.next_id, c.next_after), m.id) IS NOT NULL
          AND (c.lease_id IS NULL OR c.lease_expires_at <= now())
          AND (c.not_before IS NULL OR c.not_before <= now())
          AND (q.window_buffer = 0 OR c.lease_id IS NOT NULL
               OR (SELECT n.created_at FROM queen.messages n
                   WHERE n.partition_id = p.id ORDER BY n.id DESC LIMIT 1)
                  <= now() - make_interval(secs => q.window_buffer))
        LIMIT p_limit) w
    ORDER BY w.next_id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT x FROM queen.rank_partitions(q, p_group, p_limit) x;
    END IF;
END
$$;

-- Every partition of queue q a group may pop now ranked by its next message, oldest
-- first, up to p_limit (one probe of the partition's cursor and next message each; the
-- next message is read from the cursor row when the last ack found it, next_id):
-- queen.candidates for a narrow queue (queen.pop and queen.pop_many call it for one
-- themselves), or when its walk found none. The cursor rows are probed by key, as the
-- walk's are: a join may read every row of the group, in every queue.
CREATE OR REPLACE FUNCTION queen.rank_partitions(q queen.queues, p_group text, p_limit integer)
RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT p.id
    FROM queen.partitions p
    LEFT JOIN LATERAL (SELECT c.cursor_id, c.lease_id, c.lease_expires_at, c.not_before,
                              c.next_id, c.next_after
                       FROM queen.consumers c
                       WHERE c.partition_id = p.id AND c.consumer_group = p_group
                       LIMIT 1) c ON true
    LEFT JOIN LATERAL (SELECT m.id FROM queen.messages m
                       WHERE m.partition_id = p.id AND m.id > coalesce(c.cursor_id, 0)
                         AND queen.kept_next(c.cursor_id, c.next_id, c.next_after) IS NULL
                       ORDER BY m.id LIMIT 1) m ON true
    WHERE p.queue_id = q.id
      AND coalesce(queen.kept_next(c.cursor_id, c.next_id, c.next_after), m.id) IS NOT NULL
      AND (c.lease_id IS NULL OR c.lease_expires_at <= now())
      AND (c.not_before IS NULL OR c.not_before <= now())
      AND (q.window_buffer = 0 OR c.lease_id IS NOT NULL
           OR (SELECT n.created_at FROM queen.messages n
               WHERE n.partition_id = p.id ORDER BY n.id DESC LIMIT 1)
              <= now() - make_interval(secs => q.window_buffer))
    ORDER BY coalesce(queen.kept_next(c.cursor_id, c.next_id, c.next_after), m.id)
    LIMIT p_limit
$$;

-- Pop for a group (queue mode: '__queue__') on any route (p_kind): lease one partition
-- and return up to p_batch of its messages after the group's cursor, in order, with
-- their queue's settings. 'partition': the one named (p_partition); 'queue': p_prefer
-- first when given (the partition a wake-up named), then the free partitions whose next
-- message is oldest (queen.candidates; a partition another pop is claiming is
-- skipped); 'filter': the queues matching p_namespace and/or p_task (NULL: any) with
-- partitions, highest priority first (then the oldest queue), each as by queue. Nothing
-- when the queue or partition does not exist. A group joins each queue it tries (p_mode
-- / p_from: its subscription, applied there from that first pop on). A consumer row is
-- locked only while it has no live lease and is not held back (retryDelay): a woken poll
-- trying a leased partition must not make that lease's ack wait for the rest of its
-- (fused) call. The rare steps (an expired lease, windowBuffer, ttl) are
-- queen.claimable's; delayedProcessing hides messages younger than it. p_lease:
-- the lease id the caller chose (NULL: a new one), so that a caller who lost the answer
-- can still name the lease and give it back (queen.give_back); the lease's own id is
-- made of it and the partition's (queen.lease_in). p_candidates: by queue,
-- the ranked partitions to try (queen.pop_many ranks once for all its pops of a queue
-- and group; NULL: ranked here). Its statements keep
-- one plan per session (plan_cache_mode): PL/pgSQL would otherwise plan the batch reads
-- afresh at every call, since with the cursor and batch size known a custom plan always
-- looks cheaper, and planning is a large share of a small pop. Those generic plans are
-- the ones tests/integration/test_query_plans.py checks, with stale and with fresh
-- statistics.
DROP FUNCTION IF EXISTS queen.pop(text, text, text, text, text, text, integer, text, text,
                                   timestamptz, uuid, text);
-- (An earlier build's returned no partition_id: a changed result type cannot be replaced,
-- so that one is dropped, once; the current one is replaced in place as any other.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure(
                         'queen.pop(text, text, text, text, text, text, integer, text, text,'
                         ' timestamptz, uuid, text, uuid[])')
                 AND NOT 'partition_id' = ANY (p.proargnames)) THEN
        DROP FUNCTION queen.pop(text, text, text, text, text, text, integer, text, text,
                                timestamptz, uuid, text, uuid[]);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION queen.pop(
    p_kind text, p_queue text, p_partition text, p_namespace text, p_task text,
    p_group text, p_batch integer, p_worker text, p_mode text, p_from timestamptz,
    p_lease uuid, p_prefer text DEFAULT NULL, p_candidates uuid[] DEFAULT NULL)
RETURNS TABLE (id bigint, transaction_id text, queue text, partition text, payload jsonb,
               encrypted boolean, producer text, trace_id text, retry_count integer,
               created_at timestamptz, lease_id uuid, lease_expires_at timestamptz,
               priority integer, lease_time integer, retry_limit integer,
               partition_id uuid)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    q          queen.queues;
    c          queen.consumers;
    named      uuid;
    candidates uuid[];
    tried      integer := 0;  -- candidates tried one by one (-1: the named one was)
    one_by_one boolean;
    locked     boolean;
    candidate  uuid;
    lease      uuid;
    expires    timestamptz;
    made       text;  -- (queen.made_prefix of candidate: its messages' made transactionIds)
    matching   text;
BEGIN
    IF p_kind = 'filter' THEN  -- (each matching queue as by queue, until one gives a batch)
        -- Only queues with a partition the group may have work in: not leased (or its
        -- lease expired) and a message past its cursor (one probe each, in one statement,
        -- where a pop by queue of each would rank it). A queue passed over has nothing
        -- any pop could claim now.
        FOR matching IN
            SELECT x.name FROM queen.queues x
            CROSS JOIN LATERAL (
                SELECT 1 FROM queen.partitions p
                LEFT JOIN LATERAL (SELECT c.cursor_id, c.lease_id, c.lease_expires_at,
                                          c.next_id, c.next_after
                                   FROM queen.consumers c
                                   WHERE c.partition_id = p.id AND c.consumer_group = p_group
                                   LIMIT 1) c ON true
                LEFT JOIN LATERAL (SELECT m.id FROM queen.messages m
                                   WHERE m.partition_id = p.id
                                     AND m.id > coalesce(c.cursor_id, 0)
                                     AND queen.kept_next(c.cursor_id, c.next_id,
                                                         c.next_after) IS NULL
                                   ORDER BY m.id LIMIT 1) m ON true
                WHERE p.queue_id = x.id
                  AND coalesce(queen.kept_next(c.cursor_id, c.next_id, c.next_after), m.id)
                      IS NOT NULL
                  AND (c.lease_id IS NULL OR c.lease_expires_at <= now())
                LIMIT 1) w
            WHERE (p_namespace IS NULL OR x.namespace = p_namespace)
              AND (p_task IS NULL OR x.task = p_task)
            ORDER BY x.priority DESC, x.created_at, x.name
        LOOP
            RETURN QUERY SELECT * FROM queen.pop('queue', matching, NULL, NULL, NULL,
                                                 p_group, p_batch, p_worker, p_mode,
                                                 p_from, p_lease);
            IF FOUND THEN
                RETURN;
            END IF;
        END LOOP;
        RETURN;
    END IF;
    SELECT * INTO q FROM queen.queues x WHERE x.name = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_kind = 'partition' OR p_prefer IS NOT NULL THEN
        SELECT p.id INTO named FROM queen.partitions p
        WHERE p.queue_id = q.id
          AND p.name = CASE WHEN p_kind = 'partition' THEN coalesce(p_partition, p_prefer)
                            ELSE p_prefer END;
        IF named IS NULL AND p_kind = 'partition' THEN
            RETURN;
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM queen.consumer_groups g
                   WHERE g.queue_id = q.id AND g.consumer_group = p_group) THEN
        PERFORM queen.join_group(q.id, p_group, p_mode, p_from);
    END IF;
    LOOP
        -- The named partition first; by queue, then the candidates (ranked only when it
        -- gave nothing), in rank order: while each has a cursor row, the first free one
        -- is locked in one statement; otherwise one by one (the cursor made when tried).
        locked := false;
        IF named IS NOT NULL THEN
            candidate := named;
            tried := -1;
            named := NULL;
        ELSIF p_kind = 'queue' THEN
            IF candidates IS NULL THEN
                IF p_candidates IS NOT NULL THEN
                    candidates := p_candidates;
                ELSIF NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.queue_id = q.id
                                  ORDER BY p.id OFFSET 256 LIMIT 1) THEN
                    -- (A narrow queue ranked here, as queen.candidates would: a call of
                    -- that function costs more than this ranking itself.)
                    candidates := ARRAY(SELECT x FROM queen.rank_partitions(q, p_group, 32) x);
                ELSE
                    candidates := ARRAY(SELECT x FROM queen.candidates(q, p_group, 32) x);
                END IF;
                IF tried < 0 THEN  -- (the named one was tried)
                    candidates := array_remove(candidates, candidate);
                END IF;
                tried := 0;
                one_by_one := false;
            END IF;
            IF NOT one_by_one THEN
                -- (A probe of the key a candidate, whatever the statistics: the nested
                -- loop a LATERAL makes walks the list in its order and stops at the first
                -- row it could lock, or at a candidate with no cursor row yet.)
                SELECT x.* INTO c
                FROM unnest(candidates) u
                LEFT JOIN LATERAL (SELECT * FROM queen.consumers x
                                   WHERE x.partition_id = u AND x.consumer_group = p_group
                                     AND NOT coalesce(x.lease_expires_at > now()
                                                      OR x.not_before > now(), false)
                                   FOR UPDATE SKIP LOCKED) x ON true
                WHERE x.partition_id IS NOT NULL
                   OR NOT EXISTS (SELECT 1 FROM queen.consumers y
                                  WHERE y.partition_id = u AND y.consumer_group = p_group)
                LIMIT 1;
                EXIT WHEN NOT FOUND;  -- (every one leased, held back, or being claimed)
                IF c.partition_id IS NULL THEN  -- one with no cursor yet: one by one
                    one_by_one := true;
                ELSE
                    locked := true;
                    candidate := c.partition_id;
                    candidates := array_remove(candidates, candidate);
                END IF;
            END IF;
            IF one_by_one THEN
                tried := tried + 1;
                EXIT WHEN tried > cardinality(candidates);
                candidate := candidates[tried];
            END IF;
        ELSE
            EXIT;
        END IF;
        IF NOT locked THEN  -- the named partition, or a candidate tried alone
            SELECT * INTO c FROM queen.consumers x
            WHERE x.partition_id = candidate AND x.consumer_group = p_group
              AND NOT coalesce(x.lease_expires_at > now() OR x.not_before > now(), false)
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                -- Another pop holds it or has just leased it: next. No cursor yet: make one.
                CONTINUE WHEN EXISTS (SELECT 1 FROM queen.consumers x
                                      WHERE x.partition_id = candidate
                                        AND x.consumer_group = p_group);
                PERFORM queen.ensure_cursors(q.id, p_group, candidate);
                SELECT * INTO c FROM queen.consumers x
                WHERE x.partition_id = candidate AND x.consumer_group = p_group
                  AND NOT coalesce(x.lease_expires_at > now() OR x.not_before > now(), false)
                FOR UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
            END IF;
        END IF;
        IF c.lease_id IS NOT NULL OR q.window_buffer > 0 OR q.ttl > 0 THEN
            CONTINUE WHEN NOT queen.claimable(candidate, p_group, c.lease_id IS NOT NULL,
                                              q.window_buffer, q.ttl, p_batch);
            SELECT * INTO c FROM queen.consumers x
            WHERE x.partition_id = candidate AND x.consumer_group = p_group;
        END IF;
        -- The claim, in one statement: the batch past the cursor, the lease over it, its
        -- rows. The batch is read once, by the key (a second read by its ids would have a
        -- plan of its own, which a session could make as a sequential scan while the
        -- table was small and keep as it grew). The lease's digest joins the batch as the
        -- CTE holds it, in id order, without a sort of its own: in any other order it
        -- would only fail to match, and the ack take the items path.
        -- (The chosen id first: queen.lease_in, given an argument with a volatile call in
        -- it, would not be inlined, and a SQL function that is not is planned again in
        -- every transaction.)
        lease := coalesce(p_lease, queen.uuid_v7());
        lease := queen.lease_in(candidate, lease);
        expires := now() + make_interval(secs => q.lease_time);
        made := queen.made_prefix(candidate);
        RETURN QUERY
        WITH batch AS MATERIALIZED (
            SELECT m.id,
                   coalesce(m.transaction_id, queen.made_txid_text(made, m.id)) AS transaction_id,
                   m.payload, m.encrypted, m.producer, m.trace_id, m.created_at
            FROM queen.messages m
            WHERE m.partition_id = candidate AND m.id > c.cursor_id
              AND m.id <> ALL (c.done_ids)
              AND (q.delayed_processing = 0
                   OR m.created_at <= now() - make_interval(secs => q.delayed_processing))
            ORDER BY m.id LIMIT p_batch
        ), leased AS (
            UPDATE queen.consumers x SET
                lease_id = lease, leased_by = p_worker, lease_expires_at = expires,
                lease_last_id = s.last_id, lease_size = s.size, lease_acked = '{}',
                lease_digest = s.digest, not_before = NULL, updated_at = now()
            FROM (SELECT max(b.id) AS last_id, count(*)::integer AS size,
                         queen.lease_digest(string_agg(b.transaction_id, E'\x1f'),
                                            count(*)::integer) AS digest
                  FROM batch b) s
            WHERE x.partition_id = candidate AND x.consumer_group = p_group AND s.size > 0
        )
        SELECT b.id, b.transaction_id, q.name,
               (SELECT p.name FROM queen.partitions p WHERE p.id = candidate), b.payload,
               b.encrypted, b.producer, b.trace_id,
               CASE WHEN b.id <= c.retried_max  -- (a message of it may have been retried)
                    THEN queen.retries_of(candidate, p_group, b.id, c.retried_max)
                    ELSE 0 END,
               b.created_at, lease, expires, q.priority, q.lease_time, q.retry_limit,
               candidate
        FROM batch b
        ORDER BY b.id;
        IF FOUND THEN
            RETURN;
        END IF;
        -- Nothing claimed where the row kept a next message (deleted, or not due yet): it
        -- is forgotten, not ranked first again.
        IF queen.kept_next(c.cursor_id, c.next_id, c.next_after) IS NOT NULL THEN
            UPDATE queen.consumers x SET next_id = NULL, next_after = NULL
            WHERE x.partition_id = candidate AND x.consumer_group = p_group;
        END IF;
    END LOOP;
END
$$;

-- Pop from one named partition as a group (queen.pop by partition).
CREATE OR REPLACE FUNCTION queen.pop_partition(
    p_queue text, p_partition text, p_group text, p_batch integer, p_worker text,
    p_mode text DEFAULT NULL, p_from timestamptz DEFAULT NULL, p_lease uuid DEFAULT NULL)
RETURNS SETOF queen.delivery
LANGUAGE sql AS $$
    SELECT d.id, d.transaction_id, d.queue, d.partition, p_group, d.payload, d.encrypted,
           d.producer, d.trace_id, d.retry_count, d.created_at, d.lease_id, d.lease_expires_at
    FROM queen.pop('partition', p_queue, p_partition, NULL, NULL, p_group, p_batch,
                   p_worker, p_mode, p_from, p_lease) d
$$;

-- Pop from a queue as a group: the free partition whose next message is oldest, up to
-- p_batch messages of it in order (queen.pop by queue).
CREATE OR REPLACE FUNCTION queen.pop_queue(
    p_queue text, p_group text, p_batch integer, p_worker text,
    p_mode text DEFAULT NULL, p_from timestamptz DEFAULT NULL, p_lease uuid DEFAULT NULL)
RETURNS SETOF queen.delivery
LANGUAGE sql AS $$
    SELECT d.id, d.transaction_id, d.queue, d.partition, p_group, d.payload, d.encrypted,
           d.producer, d.trace_id, d.retry_count, d.created_at, d.lease_id, d.lease_expires_at
    FROM queen.pop('queue', p_queue, NULL, NULL, NULL, p_group, p_batch, p_worker,
                   p_mode, p_from, p_lease) d
$$;

-- Several pops in one call (a worker's concurrent pops, fused): p_pops is an array of
-- {kind, queue, partition, namespace, task, group, batch, worker, mode, since, lease,
-- prefer}, popped in one transaction, each leasing a partition of its own. Rows: the
-- pop's position (1-based) and its messages, in order, as columns (the server makes
-- each message's API id from its bigint id and created_at).
-- Two or more pops by queue of one queue, group and batch are claimed as a set: one
-- ranking of the queue's partitions (as queen.candidates ranks them), then the partitions
-- that woken ones among them name (polls woken for those) first, in their order, then
-- the ranking (a pop may get another's, all being polls of one route). One statement
-- locks the first free cursor rows in that order, one for each pop, and notes which have
-- a message to deliver; the next leases each of those its batch and answers the rows
-- (the pops in order: the first locked row is the first pop's). A row found empty is
-- left as it was, and forgets a next message it kept (deleted, or not due yet). When the
-- claim took every free partition it ranked and each gave a batch (or the ranking was
-- empty: no claim then), the route's pops it left get nothing (a walk would find the
-- same partitions leased); the pops it could
-- not serve otherwise, and all others, go one by one through queen.pop, in order, each
-- seeing the leases of those before it; those of a queue and group share one ranking (a
-- pop walks it past the partitions those before it leased, and one that finds none left
-- gets nothing rather than ranking again, since a ranking made in the same call would
-- find the same ones leased: when more consumers poll than there are partitions, most
-- pops end so, and ranking was most of their cost; once one has walked the ranking and
-- found nothing, those after it get nothing without a walk of their own).
-- No claim as a set while a partition it would try has no cursor row yet (queen.pop
-- makes one, in turn), nor on a queue with a window or ttl (queen.pop's rare steps),
-- nor over a lease that expired (queen.pop takes it over).
-- A lone pop of its route naming a partition to prefer (a poll woken for it) tries that
-- one first, and the queue is ranked only when it gave nothing.
-- The pops' commit does not wait for the disk (synchronous_commit off for the
-- transaction): a claim a crash forgets leaves its messages to be delivered again, as
-- at-least-once allows. One plan per session (plan_cache_mode), as queen.pop, and no
-- JIT: a set claim's estimates grow with the table, and compiling its statement would
-- cost many times what it takes.
CREATE OR REPLACE FUNCTION queen.pop_rows(p_pops jsonb)
RETURNS TABLE (pop integer, id bigint, transaction_id text, queue text, partition text,
               payload jsonb, encrypted boolean, retry_count integer, priority integer,
               created_at timestamptz, locked_at timestamptz, lease_id uuid,
               lease_expires_at timestamptz, lease_time integer, retry_limit integer,
               trace_id text, partition_id uuid)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
#variable_conflict use_column
DECLARE
    r       record;
    g       record;
    ignored text;
    q       queen.queues;
    ranked  text;   -- the queue and group ranking holds (NULL: none yet)
    ranking uuid[];
    spent   boolean := false;  -- a pop found nothing in the ranking
    route   text;   -- a pop by queue's queue and group
    prefer  text;
    served  integer[] := '{}';  -- positions the set claims are done with (below)
    woken   integer[] := '{}';  -- positions of woken pops a set claim tried
    preferred uuid[];           -- the partitions a set claim tries, in order
    missing boolean;            -- one of them has no cursor row yet
    picked  integer;            -- cursor rows the set claim locked
    locked  tid[];              -- those with a message to deliver, in order
    js      integer[];          -- their pops (1-based, in the set)
    took    integer[];          -- those pops' positions
    forget  tid[];              -- rows found empty that kept a next message
    expires timestamptz;
BEGIN
    ignored := set_config('synchronous_commit', 'off', true);
    IF jsonb_array_length(p_pops) > 1 THEN
        FOR g IN
            SELECT x.queue, x."group", x.batch, min(x.mode) AS mode,
                   min(x.since) AS since,
                   array_agg(x.ordinality::integer ORDER BY x.ordinality) AS positions,
                   array_agg(x.worker ORDER BY x.ordinality) AS workers,
                   array_agg(x.lease ORDER BY x.ordinality) AS leases,
                   array_agg(x.prefer ORDER BY x.ordinality) AS prefers
            FROM ROWS FROM (jsonb_to_recordset(p_pops)
                            AS (kind text, queue text, "group" text, batch integer,
                                worker text, mode text, since timestamptz, lease uuid,
                                prefer text))
                 WITH ORDINALITY x
            WHERE x.kind = 'queue'
            GROUP BY x.queue, x."group", x.batch
            HAVING count(*) > 1
        LOOP
            SELECT * INTO q FROM queen.queues x WHERE x.name = g.queue;
            CONTINUE WHEN NOT FOUND OR q.window_buffer > 0 OR q.ttl > 0;
            IF NOT EXISTS (SELECT 1 FROM queen.consumer_groups c
                           WHERE c.queue_id = q.id
                             AND c.consumer_group = g."group") THEN
                PERFORM queen.join_group(q.id, g."group", g.mode, g.since);
            END IF;
            ranked := g.queue || E'\n' || g."group";
            IF NOT EXISTS (SELECT 1 FROM queen.partitions p WHERE p.queue_id = q.id
                           ORDER BY p.id OFFSET 256 LIMIT 1) THEN  -- (as queen.pop's)
                ranking := ARRAY(SELECT x FROM queen.rank_partitions(q, g."group", 32) x);
            ELSE
                ranking := ARRAY(SELECT x FROM queen.candidates(q, g."group", 32) x);
            END IF;
            preferred := ranking;
            IF array_remove(g.prefers, NULL) <> '{}' THEN
                preferred := ARRAY(
                    SELECT p.id FROM unnest(g.prefers) WITH ORDINALITY n(name, k)
                    JOIN queen.partitions p ON p.queue_id = q.id AND p.name = n.name
                    GROUP BY p.id ORDER BY min(n.k));
                preferred := preferred || ARRAY(
                    SELECT u.x FROM unnest(ranking) WITH ORDINALITY u(x, k)
                    WHERE u.x <> ALL (preferred) ORDER BY u.k);
                woken := woken || g.positions;
            END IF;
            IF preferred = '{}' THEN  -- (none free with work, nor a lease expired: done)
                served := served || g.positions;
                CONTINUE;
            END IF;
            -- The locks. (Each LATERAL probes a key in the list's order, whatever the
            -- statistics: a join may read every row of the group, in every queue. The
            -- LIMIT stops the locks once there is a row for every pop; each locked row's
            -- next message is one probe of the index, in id order.)
            WITH m AS MATERIALIZED (
                SELECT EXISTS (SELECT 1 FROM unnest(preferred) u
                               LEFT JOIN LATERAL (SELECT true AS found FROM queen.consumers x
                                                  WHERE x.partition_id = u
                                                    AND x.consumer_group = g."group"
                                                  LIMIT 1) x
                                 ON true
                               WHERE x.found IS NULL) AS missing
            )
            SELECT m.missing, k.picked, k.locked, k.js, k.took, k.forget
            INTO missing, picked, locked, js, took, forget
            FROM m CROSS JOIN LATERAL (
                SELECT count(*)::integer AS picked,
                       coalesce(array_agg(k.row) FILTER (WHERE k.full), '{}') AS locked,
                       coalesce(array_agg(k.j) FILTER (WHERE k.full), '{}') AS js,
                       coalesce(array_agg(g.positions[k.j]) FILTER (WHERE k.full), '{}')
                         AS took,
                       coalesce(array_agg(k.row) FILTER (WHERE NOT k.full AND k.kept), '{}')
                         AS forget
                FROM (SELECT x.row, row_number() OVER ()::integer AS j,
                             (SELECT n.id FROM queen.messages n
                              WHERE n.partition_id = x.partition_id AND n.id > x.cursor_id
                                AND n.id <> ALL (x.done_ids)
                                AND (q.delayed_processing = 0
                                     OR n.created_at <= now()
                                        - make_interval(secs => q.delayed_processing))
                              ORDER BY n.id LIMIT 1) IS NOT NULL AS full,
                             queen.kept_next(x.cursor_id, x.next_id, x.next_after)
                               IS NOT NULL AS kept
                      FROM (SELECT x.* FROM unnest(preferred) u
                            CROSS JOIN LATERAL (
                                SELECT x.ctid AS row, x.partition_id, x.cursor_id,
                                       x.done_ids, x.next_id, x.next_after
                                FROM queen.consumers x
                                WHERE x.partition_id = u AND x.consumer_group = g."group"
                                  AND x.lease_id IS NULL
                                  AND NOT coalesce(x.not_before > now(), false)
                                FOR UPDATE SKIP LOCKED) x
                            WHERE NOT m.missing
                            LIMIT cardinality(g.positions)) x) k) k;
            CONTINUE WHEN missing;
            IF forget <> '{}' THEN
                UPDATE queen.consumers x SET next_id = NULL, next_after = NULL
                WHERE x.ctid = ANY (forget);
            END IF;
            -- The leases and the answer. (A partition's name is read once, with its row,
            -- not for each message: on a small table each read is a scan of the whole
            -- table; its lease id is made once too. Each lease's digest joins its batch
            -- as the CTE holds it, in id order, with no sort of its own (an aggregate's
            -- ORDER BY sorts each group apart, and rules out hashing the groups): in any
            -- other order it would only fail to match, and the ack take the items path,
            -- as queen.pop's. The LIMIT on the locked rows keeps the estimates of the
            -- messages read to what one pop reads.)
            IF locked <> '{}' THEN
                expires := now() + make_interval(secs => q.lease_time);
                RETURN QUERY
                WITH picked AS MATERIALIZED (
                    SELECT u.j, x.row, x.partition_id, x.cursor_id, x.done_ids, x.retried_max,
                           (SELECT p.name FROM queen.partitions p WHERE p.id = x.partition_id)
                             AS name,
                           queen.made_prefix(x.partition_id) AS made,
                           queen.lease_in(x.partition_id, g.leases[u.j]) AS lease
                    FROM unnest(locked, js) u(row, j)
                    CROSS JOIN LATERAL (SELECT x.ctid AS row, x.partition_id, x.cursor_id,
                                               x.done_ids, x.retried_max
                                        FROM queen.consumers x
                                        WHERE x.ctid = u.row LIMIT 1) x
                    LIMIT cardinality(locked)
                ), batch AS MATERIALIZED (
                    SELECT k.j, k.partition_id, k.row, k.name, k.lease, m.id, m.transaction_id,
                           m.payload, m.encrypted, m.created_at, m.trace_id,
                           CASE WHEN m.id <= k.retried_max  -- (a message of it may be a retry)
                                THEN queen.retries_of(k.partition_id, g."group", m.id,
                                                      k.retried_max)
                                ELSE 0 END AS retries
                    FROM picked k
                    CROSS JOIN LATERAL (SELECT m.id,
                                               coalesce(m.transaction_id,
                                                        queen.made_txid_text(k.made, m.id))
                                                 AS transaction_id,
                                               m.payload, m.encrypted, m.created_at, m.trace_id
                                        FROM queen.messages m
                                        WHERE m.partition_id = k.partition_id
                                          AND m.id > k.cursor_id
                                          AND m.id <> ALL (k.done_ids)
                                          AND (q.delayed_processing = 0
                                               OR m.created_at <= now()
                                                  - make_interval(secs => q.delayed_processing))
                                        ORDER BY m.id LIMIT g.batch) m
                ), leased AS (
                    UPDATE queen.consumers x SET
                        lease_id = s.lease, leased_by = g.workers[s.j],
                        lease_expires_at = expires,
                        lease_last_id = s.last_id, lease_size = s.size, lease_acked = '{}',
                        lease_digest = s.digest, not_before = NULL, updated_at = now()
                    FROM (SELECT b.j, b.partition_id, b.row, b.lease, max(b.id) AS last_id,
                                 count(*)::integer AS size,
                                 queen.lease_digest(string_agg(b.transaction_id, E'\x1f'),
                                                    count(*)::integer) AS digest
                          FROM batch b GROUP BY b.j, b.partition_id, b.row, b.lease) s
                    WHERE x.ctid = s.row AND x.partition_id = s.partition_id
                      AND x.consumer_group = g."group"
                )
                SELECT g.positions[b.j], b.id, b.transaction_id, q.name, b.name, b.payload,
                       b.encrypted, b.retries, q.priority, b.created_at, now(), b.lease,
                       expires, q.lease_time, q.retry_limit, b.trace_id, b.partition_id
                FROM batch b
                ORDER BY b.j, b.id;
            END IF;
            -- Done: the pops served, or all of the set when it took every free partition
            -- of the ranking and each gave a batch (those it left would find them
            -- leased), with no lease among them expired (each row probed by key).
            IF cardinality(took) = cardinality(g.positions)
               OR picked < cardinality(g.positions) AND picked = cardinality(took)
                  AND NOT EXISTS (SELECT 1 FROM unnest(preferred) u
                                  CROSS JOIN LATERAL (
                                      SELECT 1 FROM queen.consumers x
                                      WHERE x.partition_id = u
                                        AND x.consumer_group = g."group"
                                        AND x.lease_id IS NOT NULL
                                        AND x.lease_expires_at <= now()) x) THEN
                served := served || g.positions;
            ELSE
                served := served || took;
            END IF;
        END LOOP;
        IF cardinality(served) = jsonb_array_length(p_pops) THEN
            RETURN;  -- (every pop done as a set)
        END IF;
    END IF;
    FOR r IN
        SELECT x.*
        FROM ROWS FROM (jsonb_to_recordset(p_pops)
                        AS (kind text, queue text, partition text, namespace text, task text,
                            "group" text, batch integer, worker text, mode text,
                            since timestamptz, lease uuid, prefer text))
             WITH ORDINALITY x
        WHERE NOT x.ordinality::integer = ANY (served)
        ORDER BY x.ordinality
    LOOP
        route := CASE WHEN r.kind = 'queue' THEN r.queue || E'\n' || r."group" END;
        prefer := CASE WHEN r.ordinality::integer = ANY (woken) THEN NULL ELSE r.prefer END;
        LOOP  -- (twice for a pop whose named partition gave nothing before any ranking)
            -- The ranking spent, a pop by queue gets nothing: a pop before it walked
            -- every partition in it and found each leased or being claimed.
            EXIT WHEN spent AND route = ranked AND prefer IS NULL;
            IF route IS NOT NULL AND route IS DISTINCT FROM ranked AND prefer IS NULL THEN
                ranked := route;
                spent := false;
                ranking := NULL;
                SELECT * INTO q FROM queen.queues x WHERE x.name = r.queue;
                IF FOUND THEN
                    ranking := ARRAY(SELECT x FROM queen.candidates(q, r."group", 32) x);
                END IF;
            END IF;
            RETURN QUERY
            SELECT r.ordinality::integer, d.id, d.transaction_id, d.queue, d.partition,
                   d.payload, d.encrypted, d.retry_count, d.priority, d.created_at, now(),
                   d.lease_id, d.lease_expires_at, d.lease_time, d.retry_limit, d.trace_id,
                   d.partition_id
            FROM queen.pop(r.kind, r.queue, r.partition, r.namespace, r.task, r."group",
                           r.batch, r.worker, r.mode, r.since, r.lease, prefer,
                           CASE WHEN route IS NULL THEN NULL
                                WHEN route = ranked AND NOT spent THEN ranking
                                ELSE '{}' END) d;  -- (the named partition alone)
            IF NOT FOUND AND route = ranked THEN
                spent := true;
            END IF;
            EXIT WHEN FOUND OR route IS NULL OR route = ranked;
            prefer := NULL;  -- it gave nothing: the queue, ranked now
        END LOOP;
    END LOOP;
END
$$;

-- queen.pop_rows with each message as queen.popped (with the API id, or with p_api_ids
-- false only its bigint id, message_id): what an earlier build's statements call while
-- hosts are replaced one at a time, and SQL callers.
DROP FUNCTION IF EXISTS queen.pop_many(jsonb);  -- (an earlier build's: no p_api_ids)
CREATE OR REPLACE FUNCTION queen.pop_many(p_pops jsonb, p_api_ids boolean DEFAULT true)
RETURNS TABLE (pop integer, message queen.popped)
LANGUAGE sql AS $$
    SELECT r.pop,
           ROW(CASE WHEN p_api_ids THEN queen.message_uuid(r.id, r.created_at) END,
               r.transaction_id, r.queue, r.partition, r.payload, r.encrypted,
               r.retry_count, r.priority, r.created_at, r.locked_at, r.lease_id,
               r.lease_expires_at, r.lease_time, r.retry_limit, r.trace_id, r.partition_id,
               r.id)::queen.popped
    FROM queen.pop_rows(p_pops) r
$$;

-- Pops by queue of one queue, group and batch as a set, each with its worker and lease
-- id, answered at positions p_positions: what an earlier build's pop_many calls while
-- hosts are replaced (through queen.pop_many; the queue is ranked there again).
DROP FUNCTION IF EXISTS queen.claim_set(queen.queues, text, integer, uuid[], integer[],
                                         text[], uuid[], boolean);
DROP FUNCTION IF EXISTS queen.pop_set(queen.queues, text, integer, uuid[], integer[],
                                       text[], uuid[]);  -- (an earlier build's: no p_api_ids)
CREATE OR REPLACE FUNCTION queen.pop_set(q queen.queues, p_group text, p_batch integer,
                                         p_candidates uuid[], p_positions integer[],
                                         p_workers text[], p_leases uuid[],
                                         p_api_ids boolean,
                                         OUT pops integer[], OUT messages queen.popped[])
LANGUAGE sql AS $$
    SELECT array_agg(p_positions[m.pop]), array_agg(m.message)
    FROM queen.pop_many((SELECT jsonb_agg(jsonb_build_object(
                                    'kind', 'queue', 'queue', q.name, 'group', p_group,
                                    'batch', p_batch, 'worker', w.worker, 'lease', w.lease)
                                ORDER BY w.k)
                         FROM unnest(p_workers, p_leases) WITH ORDINALITY w(worker, lease, k)),
                        p_api_ids) m
$$;
