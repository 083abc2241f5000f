-- 0010: a pop takes its lease id from the caller, which gives the claim back, without
-- counting a retry, when the answer was lost with the connection (queen.give_back_claim).

-- Claim up to p_batch eligible messages of one partition whose row the caller has
-- locked and found free; lease the partition when anything was claimed, under p_lease.
-- The caller draws the lease id, so that it can give the claim back when the answer is
-- lost with the connection (queen.give_back_claim): the claim may have committed.
CREATE FUNCTION queen.claim(p_partition uuid, p_batch integer, p_worker text, p_lease uuid)
RETURNS SETOF queen.popped
LANGUAGE plpgsql
-- With stale statistics right after a burst of pushes the planner may pick a bitmap scan
-- that reads the partition's whole backlog and sorts it, and with those of a small or
-- just emptied table a sequential scan of every message (kept for the session, as the
-- plans here are generic); the index walk reads p_batch rows.
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    part   record;
    lease  uuid := p_lease;
    head   bigint;
    ahead  boolean;
    newest timestamptz;
    moved  integer;
BEGIN
    -- Moving the head forward needs the partition lock exclusively (see partition_heads).
    -- When a transaction that made messages of the partition pending has not committed
    -- yet, the claim does not wait for it: it leaves the head where it is (a bound still;
    -- the next claim walks a little further). Taken first, before release_lease below
    -- takes it shared (a lock of its own never blocks a session) and locks the head row.
    ahead := pg_try_advisory_xact_lock(queen.partition_lock_key(p_partition));

    -- The partition and its queue's options in one lookup.
    SELECT p.name, p.lease_id, q.name AS queue, q.ttl, q.window_buffer, q.delayed_processing,
           q.lease_time, q.priority, q.retry_limit
    INTO part
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE p.id = p_partition;

    IF part.lease_id IS NOT NULL THEN
        PERFORM queen.release_lease(p_partition, part.lease_id, p_notify => false);
    END IF;

    SELECT h.head_seq INTO head FROM queen.partition_heads h WHERE h.partition_id = p_partition;
    IF NOT FOUND THEN
        RETURN;  -- nothing pending
    END IF;

    IF part.ttl > 0 THEN
        UPDATE queen.messages m
        SET status = 'dead_letter', failed_at = now(), error_message = 'ttl expired'
        WHERE m.partition_id = p_partition AND m.seq >= head AND m.status = 'pending'
          AND m.created_at < now() - make_interval(secs => part.ttl);
        GET DIAGNOSTICS moved = ROW_COUNT;
        IF moved > 0 THEN
            INSERT INTO queen.status_deltas (partition_id, from_status, to_status, n)
            VALUES (p_partition, 'pending', 'dead_letter', moved);
        END IF;
    END IF;

    IF part.window_buffer > 0 THEN
        SELECT m.created_at INTO newest FROM queen.messages m
        WHERE m.partition_id = p_partition AND m.seq >= head AND m.status = 'pending'
        ORDER BY m.seq DESC LIMIT 1;
        IF newest > now() - make_interval(secs => part.window_buffer) THEN
            RETURN;
        END IF;
    END IF;

    -- One statement claims the messages, counts them, leases the partition and moves its
    -- head past them (the CTEs below act only when something was claimed). All of it
    -- sees the snapshot taken before the claim, in which the claimed rows are still
    -- pending: the new head is the seq after the last one claimed, since the claim took
    -- the oldest pending messages in order and passed over only rows no longer pending;
    -- with delayedProcessing, which leaves messages not yet due behind, the oldest
    -- pending message that was not claimed. The head moves only when the exclusive
    -- partition lock was had at once (ahead), so under it that snapshot sees every
    -- message made pending before (see partition_heads).
    -- (= ANY (ARRAY(...)) keeps the update on the primary key whatever the table size;
    -- a join was planned as a hash over every pending row of a small table.)
    -- The candidates are read without locking them (under the partition lock no other
    -- claim or ack touches these rows): the update takes each row still pending, and
    -- PostgreSQL re-checks that on the newest version of a row another transaction
    -- changed or deleted meanwhile (retention, an operator's move), after waiting for
    -- it. FOR UPDATE SKIP LOCKED wrote a lock record to the WAL for each message before
    -- its update, and skipped past a row it found locked, out of FIFO order.
    RETURN QUERY
    WITH claimed AS (
        UPDATE queen.messages m SET
            status = 'processing', lease_id = lease, worker_id = p_worker,
            locked_at = now(), lease_expires_at = now() + make_interval(secs => part.lease_time)
        WHERE m.transaction_id = ANY (ARRAY(
                  SELECT c.transaction_id FROM (
                      SELECT m.transaction_id, m.created_at FROM queen.messages m
                      WHERE m.partition_id = p_partition AND m.seq >= head
                        AND m.status = 'pending'
                      ORDER BY m.seq LIMIT p_batch) c
                  WHERE part.delayed_processing = 0
                     OR c.created_at <= now() - make_interval(secs => part.delayed_processing)))
          AND m.status = 'pending'
        RETURNING m.*
    ), counted AS (
        INSERT INTO queen.status_deltas (partition_id, from_status, to_status, n)
        SELECT p_partition, 'pending', 'processing', count(*) FROM claimed HAVING count(*) > 0
    ), leased AS (
        UPDATE queen.partitions p SET
            lease_id = lease, lease_expires_at = now() + make_interval(secs => part.lease_time),
            leased_by = p_worker, last_activity_at = now(),
            lease_first_seq = r.first_seq, lease_last_seq = r.last_seq, lease_size = r.size
        FROM (SELECT min(c.seq) AS first_seq, max(c.seq) AS last_seq, count(*) AS size
              FROM claimed c) r
        WHERE p.id = p_partition AND r.first_seq IS NOT NULL
    ), moved_head AS (
        UPDATE queen.partition_heads h SET head_seq = coalesce(
            CASE WHEN part.delayed_processing > 0 THEN
                (SELECT m.seq FROM queen.messages m
                 WHERE m.partition_id = p_partition AND m.seq >= head AND m.status = 'pending'
                   AND m.seq <> ALL (ARRAY(SELECT c.seq FROM claimed c))
                 ORDER BY m.seq LIMIT 1) END,
            (SELECT max(c.seq) + 1 FROM claimed c))
        WHERE h.partition_id = p_partition AND ahead AND EXISTS (SELECT 1 FROM claimed)
    )
    SELECT c.id, c.transaction_id, part.queue, part.name, c.payload, c.encrypted, c.retry_count,
           part.priority, c.created_at, c.locked_at, c.lease_id, c.lease_expires_at,
           part.lease_time, part.retry_limit
    FROM claimed c ORDER BY c.seq;

    IF FOUND THEN
        RETURN;
    END IF;
    -- Nothing claimed. When nothing is pending either, the partition leaves
    -- partition_heads: under the exclusive lock (this waits for pushes in flight), on a
    -- snapshot taken after it; a push that has not reached its trigger yet adds it back.
    IF NOT queen.pending_exists(p_partition) THEN
        PERFORM pg_advisory_xact_lock(queen.partition_lock_key(p_partition));
        DELETE FROM queen.partition_heads h
        WHERE h.partition_id = p_partition AND NOT queen.pending_exists(p_partition);
    END IF;
END
$$;

-- Pop from one named partition: 204-equivalent (no rows) when it is leased or empty.
CREATE FUNCTION queen.pop_partition(
    p_queue text, p_partition text, p_batch integer, p_worker text, p_lease uuid)
RETURNS SETOF queen.popped
LANGUAGE plpgsql AS $$
DECLARE
    target uuid;
    unused text;
BEGIN
    -- Commit without waiting for the WAL flush (the note before type queen.popped).
    unused := set_config('synchronous_commit', 'off', true);
    SELECT p.id INTO target
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE q.name = p_queue AND p.name = p_partition
      AND (p.lease_id IS NULL OR p.lease_expires_at <= now())
    FOR NO KEY UPDATE OF p SKIP LOCKED;
    IF FOUND THEN
        RETURN QUERY SELECT * FROM queen.claim(target, p_batch, p_worker, p_lease);
    END IF;
END
$$;

-- Pop from the free partition of a queue whose oldest pending message is oldest.
-- Walks partition_heads in order (one row per partition with work), skipping the
-- leased ones, so the cost follows the number of consumers, not the backlog.
CREATE FUNCTION queen.pop_queue_id(p_queue uuid, p_batch integer, p_worker text, p_lease uuid)
RETURNS SETOF queen.popped
LANGUAGE plpgsql
-- Index walks only, whatever the statistics the session's plans were made with: a bitmap
-- or sequential scan would read a windowed partition's whole backlog for its newest
-- message, and a bitmap scan every dead entry that drained partitions leave in
-- partition_heads_queue between vacuums.
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    target   uuid;
    tried    uuid[] := '{}';
    delay_s  integer;
    unused   text;
BEGIN
    -- Commit without waiting for the WAL flush (the note before type queen.popped).
    unused := set_config('synchronous_commit', 'off', true);
    -- Each attempt that finds nothing removes a stale head row, so attempts are cheap;
    -- the bound only caps the work of one call.
    FOR attempt IN 1..64 LOOP
        SELECT p.id, q.delayed_processing INTO target, delay_s
        FROM queen.queues q
        JOIN queen.partition_heads h ON h.queue_id = q.id
        JOIN queen.partitions p ON p.id = h.partition_id
        WHERE q.id = p_queue
          AND (p.lease_id IS NULL OR p.lease_expires_at <= now())
          AND NOT (h.partition_id = ANY (tried))
          -- Pass over partitions whose window (windowBuffer) is still open, so they do
          -- not use up the attempts (one backward walk to the newest pending message each).
          AND (q.window_buffer = 0 OR p.lease_id IS NOT NULL
               OR coalesce((SELECT m.created_at FROM queen.messages m
                            WHERE m.partition_id = p.id AND m.seq >= h.head_seq
                              AND m.status = 'pending'
                            ORDER BY m.seq DESC LIMIT 1), '-infinity')
                  <= now() - make_interval(secs => q.window_buffer))
        ORDER BY h.head_seq
        LIMIT 1
        FOR NO KEY UPDATE OF p SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        -- delayedProcessing: heads are in FIFO order, so when this one's oldest message
        -- is not due yet, no later one is.
        IF delay_s > 0 THEN
            IF (SELECT m.created_at FROM queen.messages m
                WHERE m.partition_id = target
                  AND m.seq >= (SELECT h.head_seq FROM queen.partition_heads h
                                WHERE h.partition_id = target)
                  AND m.status = 'pending'
                ORDER BY m.seq LIMIT 1) > now() - make_interval(secs => delay_s) THEN
                RETURN;
            END IF;
        END IF;
        RETURN QUERY SELECT * FROM queen.claim(target, p_batch, p_worker, p_lease);
        IF FOUND THEN
            RETURN;
        END IF;
        tried := tried || target;
    END LOOP;
END
$$;

CREATE FUNCTION queen.pop_queue(p_queue text, p_batch integer, p_worker text, p_lease uuid)
RETURNS SETOF queen.popped
LANGUAGE plpgsql AS $$
DECLARE
    target uuid;
BEGIN
    SELECT q.id INTO target FROM queen.queues q WHERE q.name = p_queue;
    IF FOUND THEN
        RETURN QUERY SELECT * FROM queen.pop_queue_id(target, p_batch, p_worker, p_lease);
    END IF;
END
$$;

-- Pop from a queue for a poll woken by a notification for one of its partitions: that
-- partition when it is free and has work, else the oldest free partition of the queue,
-- in one call (most such tries find the partition taken: every worker wakes a poll
-- per notification, and one of them wins).
CREATE FUNCTION queen.pop_queue_preferring(
    p_queue text, p_partition text, p_batch integer, p_worker text, p_lease uuid)
RETURNS SETOF queen.popped
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM queen.pop_partition(p_queue, p_partition, p_batch, p_worker, p_lease);
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM queen.pop_queue(p_queue, p_batch, p_worker, p_lease);
    END IF;
END
$$;

-- Pop across the queues matching namespace and/or task, highest priority first.
CREATE FUNCTION queen.pop_filtered(
    p_namespace text, p_task text, p_batch integer, p_worker text, p_lease uuid)
RETURNS SETOF queen.popped
LANGUAGE plpgsql AS $$
DECLARE
    candidate uuid;
BEGIN
    FOR candidate IN
        SELECT q.id FROM queen.queues q
        WHERE (p_namespace IS NULL OR q.namespace = p_namespace)
          AND (p_task IS NULL OR q.task = p_task)
          -- A probe of partition_heads_queue per matching queue (as EXISTS this became
          -- a hash of every partition_heads row).
          AND (SELECT true FROM queen.partition_heads h WHERE h.queue_id = q.id LIMIT 1)
        ORDER BY q.priority DESC, q.created_at
    LOOP
        RETURN QUERY SELECT * FROM queen.pop_queue_id(candidate, p_batch, p_worker, p_lease);
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The pops of servers from before 0010, which let the claim draw the lease id: what is
-- still running them during an upgrade keeps working. To be dropped by a later migration.
CREATE OR REPLACE FUNCTION queen.pop_partition(
    p_queue text, p_partition text, p_batch integer, p_worker text)
RETURNS SETOF queen.popped
LANGUAGE sql AS $$
    SELECT * FROM queen.pop_partition(p_queue, p_partition, p_batch, p_worker, gen_random_uuid())
$$;

CREATE OR REPLACE FUNCTION queen.pop_queue(p_queue text, p_batch integer, p_worker text)
RETURNS SETOF queen.popped
LANGUAGE sql AS $$
    SELECT * FROM queen.pop_queue(p_queue, p_batch, p_worker, gen_random_uuid())
$$;

CREATE OR REPLACE FUNCTION queen.pop_queue_preferring(
    p_queue text, p_partition text, p_batch integer, p_worker text)
RETURNS SETOF queen.popped
LANGUAGE sql AS $$
    SELECT * FROM queen.pop_queue_preferring(p_queue, p_partition, p_batch, p_worker,
                                             gen_random_uuid())
$$;

CREATE OR REPLACE FUNCTION queen.pop_filtered(
    p_namespace text, p_task text, p_batch integer, p_worker text)
RETURNS SETOF queen.popped
LANGUAGE sql AS $$
    SELECT * FROM queen.pop_filtered(p_namespace, p_task, p_batch, p_worker, gen_random_uuid())
$$;

-- Give back the claim of a pop whose answer was lost with its connection: the claim may
-- have committed, or may still be running. Once the backend that ran it (p_backend) is
-- gone, the messages still under p_lease return to pending without counting a retry
-- (queen.unclaim): the consumer never saw them. While that backend is there it is asked
-- to end, waiting up to a second; NULL then means "not yet, call again".
CREATE FUNCTION queen.give_back_claim(p_lease uuid, p_backend integer) RETURNS integer
LANGUAGE plpgsql
-- The lease's partition through partitions_leased, as in queen.extend_lease.
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    part record;
BEGIN
    IF p_backend <> pg_backend_pid()
       AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = p_backend)
       AND NOT pg_terminate_backend(p_backend, 1000) THEN
        RETURN NULL;
    END IF;
    SELECT p.id, p.lease_first_seq, p.lease_last_seq INTO part
    FROM queen.partitions p
    WHERE p.lease_id = p_lease
    FOR NO KEY UPDATE OF p;
    IF NOT FOUND THEN
        RETURN 0;  -- nothing was claimed, or it was acked, expired or given back since
    END IF;
    RETURN queen.unclaim(p_lease, ARRAY(
        SELECT m.transaction_id FROM queen.messages m
        WHERE m.partition_id = part.id
          AND m.seq BETWEEN part.lease_first_seq AND part.lease_last_seq
          AND m.status = 'processing' AND m.lease_id = p_lease));
END
$$;

-- Only the pops before 0010 called these.
DROP FUNCTION queen.claim(uuid, integer, text);
DROP FUNCTION queen.pop_queue_id(uuid, integer, text);

-- Generic plans, as for the pops they replace (0001).
ALTER FUNCTION queen.pop_queue(text, integer, text, uuid) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.pop_queue_id(uuid, integer, text, uuid) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.pop_partition(text, text, integer, text, uuid)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.pop_queue_preferring(text, text, integer, text, uuid)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.claim(uuid, integer, text, uuid) SET plan_cache_mode = force_generic_plan;
