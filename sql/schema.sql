-- Queen schema: the truth. sql/migrations/ holds the history that builds the same thing.
-- Everything lives in schema `queen`.

CREATE SCHEMA IF NOT EXISTS queen;

-- Queues carry every option as a column: the hot paths read them in SQL.
CREATE TABLE queen.queues (
    id                          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name                        text NOT NULL UNIQUE,
    namespace                   text,
    task                        text,
    priority                    integer NOT NULL DEFAULT 0,
    lease_time                  integer NOT NULL DEFAULT 300,     -- seconds
    retry_limit                 integer NOT NULL DEFAULT 3,
    max_size                    integer NOT NULL DEFAULT 0,       -- pending messages, 0 = unlimited
    ttl                         integer NOT NULL DEFAULT 0,       -- seconds, 0 = forever
    dlq_after_max_retries       boolean NOT NULL DEFAULT true,
    delayed_processing          integer NOT NULL DEFAULT 0,       -- seconds
    window_buffer               integer NOT NULL DEFAULT 0,       -- seconds
    retention_seconds           integer NOT NULL DEFAULT 0,
    completed_retention_seconds integer NOT NULL DEFAULT 0,
    retention_enabled           boolean NOT NULL DEFAULT false,
    encryption_enabled          boolean NOT NULL DEFAULT false,
    max_wait_time_seconds       integer NOT NULL DEFAULT 0,       -- 0 = no cap
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX queues_namespace ON queen.queues (namespace) WHERE namespace IS NOT NULL;
CREATE INDEX queues_task ON queen.queues (task) WHERE task IS NOT NULL;

-- A partition is a FIFO lane and the unit of leasing: while lease_id is set and
-- lease_expires_at is in the future, one consumer owns it. The messages of the lease
-- (status 'processing', lease_id = lease_id) lie between lease_first_seq and
-- lease_last_seq, lease_size of them: the claim sets these with the lease, and they are
-- cleared with it.
CREATE TABLE queen.partitions (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    queue_id          uuid NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name              text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    last_activity_at  timestamptz NOT NULL DEFAULT now(),
    lease_id          uuid,
    lease_expires_at  timestamptz,
    leased_by         text,
    lease_first_seq   bigint,
    lease_last_seq    bigint,
    lease_size        integer,
    UNIQUE (queue_id, name)
) WITH (fillfactor = 70);
CREATE INDEX partitions_leased ON queen.partitions (lease_expires_at) WHERE lease_id IS NOT NULL;

CREATE TABLE queen.messages (
    transaction_id   text COLLATE "C" PRIMARY KEY,
    id               uuid NOT NULL,
    seq              bigint GENERATED ALWAYS AS IDENTITY,   -- FIFO order within a partition
    -- No foreign key: a per-row check costs a third of a batch insert. queen.push holds
    -- FOR KEY SHARE on the partitions it writes to instead, once per call, which keeps a
    -- partition from being removed under a push just as the key would.
    partition_id     uuid NOT NULL,
    payload          jsonb NOT NULL,
    encrypted        boolean NOT NULL DEFAULT false,        -- payload is {"iv","tag","data"}
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'processing', 'completed', 'failed', 'dead_letter')),
    retry_count      integer NOT NULL DEFAULT 0,
    worker_id        text,
    lease_id         uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    locked_at        timestamptz,
    lease_expires_at timestamptz,
    completed_at     timestamptz,
    failed_at        timestamptz,
    error_message    text
) WITH (
    -- A claim and an ack each rewrite a row, all rows of a page at once when a batch
    -- covers it, and a claimed version is larger than the inserted one (lease columns
    -- set): 60 % of the page left free keeps the new versions there (HOT, see the indexes
    -- below; an ack finds the claim's old versions pruned by then). End to end at batch
    -- 100: 95 % of the updates HOT at 40, 86 % at 50, for about the same table size.
    fillfactor = 40,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);
-- Every index of messages covers columns that never change after the insert (is_failed,
-- in 0004, changes only on the rare move to failed or dead_letter). A claim or an ack then
-- changes no indexed value, and PostgreSQL writes the new row version as a heap-only
-- tuple (HOT): no index entry at all, where a status in an index or in a partial index's
-- condition cost four new entries per message and status change. Finding rows by status
-- goes through the partition's position instead: its pending messages from its head
-- (partition_heads), the messages of its lease between the lease's first and last seq.
-- A partition in FIFO order: the claim walks it from the head.
CREATE INDEX messages_partition_seq ON queen.messages (partition_id, seq);
-- Listing and retention walk a partition by time, for any status.
CREATE INDEX messages_partition_created ON queen.messages (partition_id, created_at);

-- One row per partition that may hold pending messages, with a bound: every pending
-- message of the partition has seq >= head_seq (and a partition with a pending message
-- has a row). Pop walks a partition from there, and pop by queue walks these rows (one
-- per partition, oldest head first) instead of the message backlog.
-- The bound holds under the partition's advisory lock (queen.partition_lock_key):
-- whatever makes a message pending (the insert trigger, a retry, an expired lease)
-- calls queen.mark_pending, which takes it shared and pulls the head back to that
-- message, until its transaction ends; what moves a head forward or removes it (a claim,
-- an ack that ends a lease on an empty partition) takes it exclusively first, so it
-- waits for such transactions to commit and then sees their messages. A push that drew
-- a lower seq but reaches its trigger later finds the head already moved and pulls it
-- back.
CREATE TABLE queen.partition_heads (
    partition_id  uuid PRIMARY KEY REFERENCES queen.partitions (id) ON DELETE CASCADE,
    queue_id      uuid NOT NULL,
    head_seq      bigint NOT NULL
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.01);
CREATE INDEX partition_heads_queue ON queen.partition_heads (queue_id, head_seq);

-- ---------------------------------------------------------------------------
-- Functions
-- ---------------------------------------------------------------------------

-- Time-ordered UUID (RFC 9562 version 7).
CREATE FUNCTION queen.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

CREATE FUNCTION queen.partition_lock_key(p_partition uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(p_partition::text, 7)
$$;

-- What a long poll listens for: 'queue/partition/namespace/task' (names cannot contain
-- '/'; at most ~520 bytes, far below NOTIFY's 8000-byte limit).
CREATE FUNCTION queen.wake_payload(p_queue text, p_partition text, p_namespace text, p_task text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_queue || '/' || p_partition || '/' || coalesce(p_namespace, '') || '/' || coalesce(p_task, '')
$$;

-- Wake long polls that may now find work in these partitions: one notification per
-- partition on channel 'queen' with queen.wake_payload. It is sent when the calling
-- transaction commits (never on rollback), and PostgreSQL folds identical payloads of
-- one transaction, so calling it again for a partition costs nothing more. Unknown ids
-- are ignored. Callers: mark_pending (messages inserted, or made pending again by an
-- admin retry), ack and release_lease (a lease ended), unclaim, and maintenance for
-- every change that makes work eligible without touching a message: delayed messages
-- becoming due (delayedProcessing), a partition's window closing (windowBuffer), a
-- lease found expired. Notifications are hints: a woken poll re-checks the database, so
-- a spare call costs one query and a missing one costs latency (until the fallback
-- re-check), never a message. Call it once per statement with every partition
-- concerned, not per row.
CREATE FUNCTION queen.notify_partitions(p_partitions uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('queen', queen.wake_payload(q.name, p.name, q.namespace, q.task))
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE p.id = ANY (p_partitions);
END
$$;

-- Record that messages became pending: p_seqs[i] (the lowest seq among them) in
-- partition p_partitions[i], a partition possibly repeated. Under the shared partition
-- lock (see partition_heads), give each partition a head row or pull its head back to
-- that seq, and wake waiters (unless p_notify is false).
CREATE FUNCTION queen.mark_pending(p_partitions uuid[], p_seqs bigint[],
                                   p_notify boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
-- A probe of partition_heads per partition whatever the statistics (the LATERAL ...
-- LIMIT 1 keeps each lookup a subquery of its own): planned as joins, the lookups were a
-- hash over every head row while the table was small, and stayed so for the session.
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    missing  uuid[];
    lowest   bigint[];
    behind   boolean;
    added    integer;
    pulled   record;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(queen.partition_lock_key(x))
    FROM (SELECT DISTINCT x FROM unnest(p_partitions) x) d ORDER BY x;

    -- Usually every partition has its row and its head is below the new messages: one
    -- lookup, nothing to write.
    SELECT array_agg(n.id ORDER BY n.id) FILTER (WHERE h.partition_id IS NULL),
           array_agg(n.seq ORDER BY n.id) FILTER (WHERE h.partition_id IS NULL),
           coalesce(bool_or(h.head_seq > n.seq), false)
    INTO missing, lowest, behind
    FROM (SELECT x.id, min(x.seq) AS seq FROM unnest(p_partitions, p_seqs) x(id, seq)
          GROUP BY x.id) n
    LEFT JOIN LATERAL (SELECT h.partition_id, h.head_seq FROM queen.partition_heads h
                       WHERE h.partition_id = n.id LIMIT 1) h ON true;

    IF missing IS NOT NULL THEN
        INSERT INTO queen.partition_heads (partition_id, queue_id, head_seq)
        SELECT p.id, p.queue_id, n.seq
        FROM unnest(missing, lowest) n(id, seq)
        CROSS JOIN LATERAL (SELECT p.id, p.queue_id FROM queen.partitions p
                            WHERE p.id = n.id LIMIT 1) p
        ORDER BY p.id
        ON CONFLICT (partition_id) DO NOTHING;
        -- A row not inserted was being inserted by another transaction (the insert
        -- waited for it): its head may be above these messages.
        GET DIAGNOSTICS added = ROW_COUNT;
        behind := behind OR added < cardinality(missing);
    END IF;

    IF behind THEN
        -- Pull heads back, one row at a time in partition order (a partition's lowest seq
        -- first: the update of a higher one then finds nothing to do).
        FOR pulled IN
            SELECT x.id, x.seq
            FROM unnest(p_partitions, p_seqs) x(id, seq)
            CROSS JOIN LATERAL (SELECT h.head_seq FROM queen.partition_heads h
                                WHERE h.partition_id = x.id LIMIT 1) h
            WHERE h.head_seq > x.seq
            ORDER BY x.id, x.seq
        LOOP
            UPDATE queen.partition_heads h SET head_seq = pulled.seq
            WHERE h.partition_id = pulled.id AND h.head_seq > pulled.seq;
        END LOOP;
    END IF;

    IF p_notify THEN
        PERFORM queen.notify_partitions(p_partitions);
    END IF;
END
$$;

-- Whether a partition holds a pending message: a walk from its head that stops at the
-- first one. (PL/pgSQL, not SQL: an SQL function with a subquery is not inlined, and
-- was planned again for every statement calling it. The head is read first, so that it
-- bounds the index walk whatever the plan: as a join condition it could end up a filter
-- on a walk from the partition's first message. With the statistics of a small or just
-- emptied table the walk was planned as a bitmap scan of the partition's whole range,
-- kept for the session: the index walk is pinned.)
CREATE FUNCTION queen.pending_exists(p_partition uuid) RETURNS boolean
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    head bigint;
BEGIN
    SELECT h.head_seq INTO head FROM queen.partition_heads h WHERE h.partition_id = p_partition;
    RETURN head IS NOT NULL AND coalesce((
        SELECT true FROM queen.messages m
        WHERE m.partition_id = p_partition AND m.seq >= head AND m.status = 'pending'
        ORDER BY m.seq LIMIT 1), false);
END
$$;

-- Whether a message of lease p_lease is still in flight in partition p_partition: a walk
-- of the lease's seq range (at most the size of the claim), which ends at the first such
-- message.
CREATE FUNCTION queen.lease_open(p_partition uuid, p_lease uuid) RETURNS boolean
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    first_seq bigint;
    last_seq  bigint;
BEGIN
    -- (The range is read first, and the walk pinned, for the reasons given at
    -- pending_exists. Without the order, the statistics of a small table made it a walk
    -- of (partition_id, created_at) over the partition's every message, seq a filter.)
    SELECT p.lease_first_seq, p.lease_last_seq INTO first_seq, last_seq
    FROM queen.partitions p WHERE p.id = p_partition;
    RETURN coalesce((
        SELECT true FROM queen.messages m
        WHERE m.partition_id = p_partition AND m.seq BETWEEN first_seq AND last_seq
          AND m.status = 'processing' AND m.lease_id = p_lease
        ORDER BY m.seq LIMIT 1), false);
END
$$;

-- New messages wake waiters inside the inserting transaction, unless the session has
-- set queen.push_notify = 'after_commit': then it calls queen.notify_pushed itself once
-- the insert committed (Queen's API does; see there why).
CREATE FUNCTION queen.messages_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queen.mark_pending(array_agg(n.partition_id), array_agg(n.seq),
                               current_setting('queen.push_notify', true)
                               IS DISTINCT FROM 'after_commit')
    FROM (SELECT r.partition_id, min(r.seq) AS seq FROM new_rows r
          WHERE r.status = 'pending' GROUP BY r.partition_id) n
    HAVING count(*) > 0;
    RETURN NULL;
END
$$;

-- Workers with long polls parked, each listed until a moment it keeps pushing forward
-- while polls wait there. Pushes skip their wake-ups while nobody is listed: no poll can
-- be parked unseen, because a worker lists itself (and commits) before its first poll
-- checks the database, and the push looks after its own commit. Unlogged: after a
-- crash, workers list themselves again within a fallback period.
CREATE UNLOGGED TABLE queen.waiting_workers (
    worker text PRIMARY KEY,
    until  timestamptz NOT NULL
);

CREATE FUNCTION queen.list_waiting_worker(p_worker text, p_seconds integer) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO queen.waiting_workers AS w (worker, until)
    VALUES (p_worker, now() + make_interval(secs => p_seconds))
    ON CONFLICT (worker) DO UPDATE SET until = greatest(w.until, EXCLUDED.until);
    DELETE FROM queen.waiting_workers WHERE until < now() - interval '1 hour';
$$;

-- Wake-ups for pushes already committed, by queue and partition name: what a session
-- with queen.push_notify = 'after_commit' sends after its inserts, in a transaction of
-- its own, for one push or many; nothing while no worker has a poll parked. NOTIFY
-- holds a cluster-wide lock from the start of commit until the commit is durable, so
-- notifying inside the push would line up the WAL flushes of all concurrent pushes one
-- behind another (bench/notify_cost.py). Here the commit is asynchronous: a
-- notification needs no durability, and the lock is held for microseconds. Unknown
-- names are ignored.
CREATE FUNCTION queen.notify_pushed(p_queues text[], p_partitions text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queen.waiting_workers w WHERE w.until > now()) THEN
        RETURN;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_notify('queen', queen.wake_payload(q.name, p.name, q.namespace, q.task))
    FROM (SELECT DISTINCT * FROM unnest(p_queues, p_partitions)) n(queue, partition)
    JOIN queen.queues q ON q.name = n.queue
    JOIN queen.partitions p ON p.queue_id = q.id AND p.name = n.partition;
END
$$;

CREATE TRIGGER messages_inserted AFTER INSERT ON queen.messages
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION queen.messages_inserted();

-- Return the un-acked messages of an expired lease to pending with retry_count + 1,
-- or to dead_letter / failed past the queue's retry limit; free the partition and,
-- when it still has pending work, wake a waiter (p_notify => false when the caller
-- claims the partition itself). The caller holds the partition row lock.
CREATE FUNCTION queen.release_lease(p_partition uuid, p_lease uuid, p_notify boolean DEFAULT true)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    released integer;
    retried  bigint;
BEGIN
    WITH q AS (
        SELECT q.retry_limit, q.dlq_after_max_retries, p.lease_first_seq, p.lease_last_seq
        FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
        WHERE p.id = p_partition
    ), changed AS (
        UPDATE queen.messages m SET
            status = CASE WHEN m.retry_count + 1 <= q.retry_limit THEN 'pending'
                          WHEN q.dlq_after_max_retries THEN 'dead_letter'
                          ELSE 'failed' END,
            retry_count = CASE WHEN m.retry_count + 1 <= q.retry_limit
                               THEN m.retry_count + 1 ELSE m.retry_count END,
            failed_at = CASE WHEN m.retry_count + 1 <= q.retry_limit THEN m.failed_at ELSE now() END,
            error_message = CASE WHEN m.retry_count + 1 <= q.retry_limit THEN m.error_message
                                 ELSE 'lease expired' END,
            lease_id = NULL, lease_expires_at = NULL, worker_id = NULL
        FROM q
        WHERE m.partition_id = p_partition
          AND m.seq BETWEEN q.lease_first_seq AND q.lease_last_seq
          AND m.status = 'processing' AND m.lease_id = p_lease
        RETURNING m.status, m.seq
    ), counted AS (
        -- Status changes are counted where they are made (see queen.record_changes).
        INSERT INTO queen.status_deltas (partition_id, from_status, to_status, n)
        SELECT p_partition, 'processing', c.status, count(*) FROM changed c GROUP BY c.status
    )
    SELECT count(*), min(c.seq) FILTER (WHERE c.status = 'pending') INTO released, retried
    FROM changed c;
    IF retried IS NOT NULL THEN
        PERFORM queen.mark_pending(ARRAY[p_partition], ARRAY[retried], p_notify => false);
    END IF;

    UPDATE queen.partitions
    SET lease_id = NULL, lease_expires_at = NULL, leased_by = NULL,
        lease_first_seq = NULL, lease_last_seq = NULL, lease_size = NULL
    WHERE id = p_partition AND lease_id = p_lease;
    IF FOUND AND p_notify AND queen.pending_exists(p_partition) THEN
        PERFORM queen.notify_partitions(ARRAY[p_partition]);
    END IF;
    RETURN released;
END
$$;

-- Give back a claim whose response never reached the client: its messages return to
-- pending WITHOUT counting a retry (the consumer never saw them), back at the head of
-- their partition, and the lease ends, waking a waiter. Messages of the claim that are
-- no longer under p_lease (acked, or re-leased after expiry) are left alone.
CREATE FUNCTION queen.unclaim(p_lease uuid, p_transaction_ids text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    part     uuid;
    released integer;
    lowest   bigint;
BEGIN
    SELECT m.partition_id INTO part FROM queen.messages m
    WHERE m.transaction_id = ANY (p_transaction_ids) AND m.lease_id = p_lease
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM queen.partitions p WHERE p.id = part FOR NO KEY UPDATE;

    WITH given AS (
        UPDATE queen.messages m SET
            status = 'pending', lease_id = NULL, lease_expires_at = NULL, worker_id = NULL,
            locked_at = NULL
        WHERE m.transaction_id = ANY (p_transaction_ids) AND m.lease_id = p_lease
          AND m.status = 'processing'
        RETURNING m.seq
    )
    SELECT count(*), min(g.seq) INTO released, lowest FROM given g;
    IF released > 0 THEN
        INSERT INTO queen.status_deltas (partition_id, from_status, to_status, n)
        VALUES (part, 'processing', 'pending', released);
        -- Back at the head: mark_pending pulls the head back to the lowest of them.
        PERFORM queen.mark_pending(ARRAY[part], ARRAY[lowest], p_notify => false);
    END IF;

    UPDATE queen.partitions p
    SET lease_id = NULL, lease_expires_at = NULL, leased_by = NULL,
        lease_first_seq = NULL, lease_last_seq = NULL, lease_size = NULL
    WHERE p.id = part AND p.lease_id = p_lease AND NOT queen.lease_open(part, p_lease);
    PERFORM queen.notify_partitions(ARRAY[part]);
    RETURN released;
END
$$;

-- The long-poll fallback: wake payloads of free partitions (no live lease) with pending
-- work, among the queues, queue/partition pairs and namespace/task filters (NULL
-- matches anything) that parked polls wait for, oldest head first. One query per
-- process per fallback period, whatever the number of waiters; each queue is walked
-- in head order through partition_heads_queue and only as far as p_limit free
-- partitions. A hint like a notification: the work may still be delayed or windowed.
CREATE FUNCTION queen.ready_partitions(
    p_queues text[], p_partition_queues text[], p_partitions text[],
    p_namespaces text[], p_tasks text[], p_limit integer)
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    WITH wanted AS (
        SELECT q.* FROM queen.queues q WHERE q.name = ANY (p_queues)
        UNION
        SELECT q.* FROM queen.queues q
        WHERE EXISTS (SELECT 1 FROM unnest(p_namespaces, p_tasks) f(ns, tk)
                      WHERE (f.ns IS NULL OR f.ns = q.namespace)
                        AND (f.tk IS NULL OR f.tk = q.task))
    ), ready AS (
        SELECT r.head_seq, queen.wake_payload(w.name, r.name, w.namespace, w.task) AS payload
        FROM wanted w
        CROSS JOIN LATERAL (
            SELECT h.head_seq, p.name
            FROM queen.partition_heads h JOIN queen.partitions p ON p.id = h.partition_id
            WHERE h.queue_id = w.id AND (p.lease_id IS NULL OR p.lease_expires_at <= now())
            ORDER BY h.head_seq
            LIMIT p_limit) r
        UNION ALL
        SELECT h.head_seq, queen.wake_payload(q.name, p.name, q.namespace, q.task)
        FROM unnest(p_partition_queues, p_partitions) n(queue, partition)
        JOIN queen.queues q ON q.name = n.queue
        JOIN queen.partitions p ON p.queue_id = q.id AND p.name = n.partition
        JOIN queen.partition_heads h ON h.partition_id = p.id
        WHERE (p.lease_id IS NULL OR p.lease_expires_at <= now())
    )
    SELECT payload FROM ready
    GROUP BY payload
    ORDER BY min(head_seq)
    LIMIT p_limit
$$;

-- Claims and acks commit without waiting for the WAL flush: pop_partition, pop_queue_id
-- and ack set synchronous_commit = off for their own transaction (an assignment, not a
-- statement: nothing to plan). A crash can forget the last few of them, which only means
-- a redelivery (at-least-once); pushes stay synchronous, so no accepted message is ever
-- lost.

-- What a pop returns for each message.
CREATE TYPE queen.popped AS (
    id uuid, transaction_id text, queue text, partition text, payload jsonb,
    encrypted boolean, retry_count integer, priority integer, created_at timestamptz,
    locked_at timestamptz, lease_id uuid, lease_expires_at timestamptz,
    lease_time integer, retry_limit integer
);

-- Claim up to p_batch eligible messages of one partition whose row the caller has
-- locked and found free; lease the partition when anything was claimed.
CREATE FUNCTION queen.claim(p_partition uuid, p_batch integer, p_worker text)
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
    lease  uuid := gen_random_uuid();
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
CREATE FUNCTION queen.pop_partition(p_queue text, p_partition text, p_batch integer, p_worker text)
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
        RETURN QUERY SELECT * FROM queen.claim(target, p_batch, p_worker);
    END IF;
END
$$;

-- Pop from the free partition of a queue whose oldest pending message is oldest.
-- Walks partition_heads in order (one row per partition with work), skipping the
-- leased ones, so the cost follows the number of consumers, not the backlog.
CREATE FUNCTION queen.pop_queue_id(p_queue uuid, p_batch integer, p_worker text)
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
        RETURN QUERY SELECT * FROM queen.claim(target, p_batch, p_worker);
        IF FOUND THEN
            RETURN;
        END IF;
        tried := tried || target;
    END LOOP;
END
$$;

CREATE FUNCTION queen.pop_queue(p_queue text, p_batch integer, p_worker text)
RETURNS SETOF queen.popped
LANGUAGE plpgsql AS $$
DECLARE
    target uuid;
BEGIN
    SELECT q.id INTO target FROM queen.queues q WHERE q.name = p_queue;
    IF FOUND THEN
        RETURN QUERY SELECT * FROM queen.pop_queue_id(target, p_batch, p_worker);
    END IF;
END
$$;

-- Pop from a queue for a poll woken by a notification for one of its partitions: that
-- partition when it is free and has work, else the oldest free partition of the queue,
-- in one call (most such tries find the partition taken: every worker wakes a poll
-- per notification, and one of them wins).
CREATE FUNCTION queen.pop_queue_preferring(
    p_queue text, p_partition text, p_batch integer, p_worker text)
RETURNS SETOF queen.popped
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM queen.pop_partition(p_queue, p_partition, p_batch, p_worker);
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM queen.pop_queue(p_queue, p_batch, p_worker);
    END IF;
END
$$;

-- Pop across the queues matching namespace and/or task, highest priority first.
CREATE FUNCTION queen.pop_filtered(p_namespace text, p_task text, p_batch integer, p_worker text)
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
        RETURN QUERY SELECT * FROM queen.pop_queue_id(candidate, p_batch, p_worker);
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- One item of a push as stored (idx: its position in the request).
CREATE TYPE queen.push_item AS (
    idx integer, id uuid, transaction_id text, seq bigint, partition_id uuid,
    payload jsonb, encrypted boolean
);

CREATE TYPE queen.push_target AS (queue text, partition text, partition_id uuid, queue_id uuid);

-- Insert a batch of messages (the push body's "items" array) in one call.
-- Queues and partitions are created as needed; a transactionId already stored
-- (or repeated earlier in the batch) is a duplicate; items past a queue's maxSize
-- are rejected. p_producer: the name of the token that pushed (NULL without
-- authentication), kept on each message. Returns one row per item, in item order.
CREATE FUNCTION queen.push(p_items jsonb, p_producer text DEFAULT NULL)
RETURNS TABLE (idx integer, message_id uuid, transaction_id text, status text)
LANGUAGE plpgsql AS $$
DECLARE
    names    queen.push_target[];
    targets  queen.push_target[];
    limited  record;
    rejected integer[] := '{}';
    accepted queen.push_item[];
    chosen   boolean;  -- some accepted item carries the client's transactionId
    stored   bigint;
BEGIN
    IF jsonb_array_length(p_items) = 0 THEN
        RETURN;  -- (the lookup loop below would never see its names resolved)
    END IF;
    -- (Distinct names first, then sorted: DISTINCT over the rows themselves sorted every
    -- item by record comparison, 4 % of a push of 1,000.)
    SELECT array_agg(ROW(n.queue, n.partition, NULL, NULL)::queen.push_target
                     ORDER BY n.queue, n.partition)
    INTO names
    FROM (SELECT DISTINCT i ->> 'queue' AS queue, coalesce(i ->> 'partition', 'Default') AS partition
          FROM jsonb_array_elements(p_items) i) n;

    LOOP
        -- Find the partitions through their unique index (one probe per name, whatever the
        -- number of partitions) and keep them from being removed until this transaction
        -- ends. One missing (new, or removed by maintenance meanwhile) is created and the
        -- lookup runs again.
        -- (LATERAL probes: one plan serves every call, and a join could be planned as a
        -- hash over every partition; names are sorted, so pushes lock in one order.)
        SELECT array_agg(ROW(n.queue, n.partition, p.id, q.id)::queen.push_target)
        INTO targets
        FROM unnest(names) n
        CROSS JOIN LATERAL (SELECT q.id FROM queen.queues q WHERE q.name = n.queue LIMIT 1) q
        CROSS JOIN LATERAL (SELECT p.id FROM queen.partitions p
                            WHERE p.queue_id = q.id AND p.name = n.partition
                            FOR KEY SHARE) p;
        EXIT WHEN cardinality(targets) = cardinality(names);

        INSERT INTO queen.queues (name)
        SELECT DISTINCT n.queue FROM unnest(names) n ORDER BY 1
        ON CONFLICT (name) DO NOTHING;
        INSERT INTO queen.partitions (queue_id, name)
        SELECT q.id, n.partition FROM unnest(names) n JOIN queen.queues q ON q.name = n.queue
        ORDER BY 1, 2
        ON CONFLICT (queue_id, name) DO NOTHING;
    END LOOP;

    -- maxSize: serialise pushes per limited queue, count what is pending, reject the rest.
    FOR limited IN
        SELECT q.id, q.max_size
        FROM (SELECT DISTINCT t.queue_id FROM unnest(targets) t) t
        CROSS JOIN LATERAL (SELECT q.id, q.max_size FROM queen.queues q
                            WHERE q.id = t.queue_id AND q.max_size > 0 LIMIT 1) q
        ORDER BY q.id
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(limited.id::text, 11));
        rejected := rejected || ARRAY(
            SELECT x.ord::integer
            FROM jsonb_array_elements(p_items) WITH ORDINALITY x(i, ord)
            JOIN unnest(targets) t ON t.queue = x.i ->> 'queue'
                                  AND t.partition = coalesce(x.i ->> 'partition', 'Default')
            WHERE t.queue_id = limited.id
            ORDER BY x.ord
            OFFSET greatest(0, limited.max_size - (
                SELECT count(*) FROM (
                    SELECT 1 FROM queen.partition_heads h
                    JOIN queen.messages m ON m.partition_id = h.partition_id
                                         AND m.seq >= h.head_seq
                    WHERE h.queue_id = limited.id AND m.status = 'pending'
                    LIMIT limited.max_size) pending)));
    END LOOP;

    -- FIFO position (seq) in item order, drawn before an insert could reorder rows.
    -- Message ids: one UUIDv7 per call, counted up in its low 48 random bits for each
    -- item (RFC 9562's monotonic random method): unique and in item order, at a third of
    -- the cost of a UUIDv7 per item (gen_random_uuid reads the strong random source,
    -- 1 us of about 14 per stored item). (Materialized: a subquery's columns were
    -- computed again for each item, the uuid printed twice.)
    WITH base AS MATERIALIZED (
        SELECT left(u::text, 24) AS prefix, ('x' || right(u::text, 12))::bit(48)::bigint AS low
        FROM queen.uuid_v7() u
    )
    SELECT array_agg(ROW(r.idx, r.made::uuid, coalesce(r.i ->> 'transactionId', r.made),
                         nextval('queen.messages_seq_seq'::regclass), r.partition_id,
                         r.i -> 'payload', coalesce((r.i ->> 'encrypted')::boolean, false)
                        )::queen.push_item),
           bool_or(r.i ? 'transactionId')
    INTO accepted, chosen
    FROM (SELECT x.ord::integer AS idx, x.i, t.partition_id,
                 b.prefix || lpad(to_hex((b.low + x.ord) & 281474976710655), 12, '0') AS made
          FROM base b
          CROSS JOIN jsonb_array_elements(p_items) WITH ORDINALITY x(i, ord)
          JOIN unnest(targets) t ON t.queue = x.i ->> 'queue'
                                AND t.partition = coalesce(x.i ->> 'partition', 'Default')
          WHERE x.ord <> ALL (rejected)
          ORDER BY x.ord) r;

    IF chosen THEN
        -- Ids the client chose may be stored already: those rows are left out (and
        -- reported below). Inserted in transactionId order: concurrent pushes sharing
        -- ids take them in the same order and wait for each other instead of deadlocking.
        INSERT INTO queen.messages (transaction_id, id, seq, partition_id, payload, encrypted, producer)
        OVERRIDING SYSTEM VALUE
        SELECT a.transaction_id, a.id, a.seq, a.partition_id, a.payload, a.encrypted, p_producer
        FROM unnest(accepted) a ORDER BY a.transaction_id COLLATE "C", a.idx
        ON CONFLICT DO NOTHING;
    ELSE
        -- Ids made here (UUIDv7, random in 74 bits) are new: a plain insert, without the
        -- conflict check of each row against the primary key first and the second WAL
        -- record that ON CONFLICT costs (2 of 16 us per row).
        INSERT INTO queen.messages (transaction_id, id, seq, partition_id, payload, encrypted, producer)
        OVERRIDING SYSTEM VALUE
        SELECT a.transaction_id, a.id, a.seq, a.partition_id, a.payload, a.encrypted, p_producer
        FROM unnest(accepted) a;
    END IF;
    GET DIAGNOSTICS stored = ROW_COUNT;

    IF stored = cardinality(accepted) THEN
        -- Every item was stored (the common case): nothing to look up.
        RETURN QUERY
        SELECT a.idx, a.id, a.transaction_id, 'queued' FROM unnest(accepted) a
        UNION ALL
        SELECT r, NULL, NULL, 'rejected' FROM unnest(rejected) r
        ORDER BY 1;
        RETURN;
    END IF;
    -- A new statement sees the rows just stored and those a concurrent push committed:
    -- an item was stored by this call exactly when the row carries the id made for it.
    RETURN QUERY
    SELECT a.idx, m.id, a.transaction_id,
           CASE WHEN m.id = a.id THEN 'queued' ELSE 'duplicate' END
    FROM unnest(accepted) a
    LEFT JOIN queen.messages m ON m.transaction_id = a.transaction_id
    UNION ALL
    SELECT r, NULL, NULL, 'rejected' FROM unnest(rejected) r
    ORDER BY 1;
END
$$;

-- Acknowledge a batch: [{"transactionId", "status": "completed"|"failed", "error"}].
-- (ended: this acknowledgment took the message out of its lease.)
CREATE TYPE queen.ack_result AS (
    transaction_id text, status text, retry_count integer,
    partition_id uuid, lease_id uuid, ended boolean
);

-- One status change of one message, as counted by queen.record_changes (0002;
-- lag_ms: created -> completed, for completions).
CREATE TYPE queen.status_change AS (
    partition_id uuid, from_status text, to_status text, lag_ms double precision
);

CREATE FUNCTION queen.ack(p_acks jsonb)
RETURNS TABLE (idx integer, transaction_id text, status text, retry_count integer)
LANGUAGE plpgsql
-- Each message is found through the primary key whatever the statistics: with those of a
-- small or just emptied table, the generic plans (kept for the session) read every
-- message three times per call, in sequential scans.
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    todo     jsonb := p_acks;
    results  queen.ack_result[];
    changes  queen.status_change[];
    retried  uuid[];
    retried_seqs bigint[];
    found_r  queen.ack_result[];
    found_c  queen.status_change[];
    found_p  uuid[];
    found_s  bigint[];
    skipped  bigint;
    released uuid[];
    freed    uuid[];
    drained  uuid;
    unused   text;
BEGIN
    -- Commit without waiting for the WAL flush (the note before type queen.popped).
    unused := set_config('synchronous_commit', 'off', true);
    -- Lock the partitions first (the order pop uses): concurrent acks of one lease
    -- then run one after the other, and the last one sees that the lease is done.
    -- (= ANY (ARRAY(...)) keeps this on the primary key; IN (...) hashed every partition.)
    PERFORM 1 FROM queen.partitions p
    WHERE p.id = ANY (ARRAY(SELECT m.partition_id FROM queen.messages m
                            WHERE m.transaction_id = ANY (ARRAY(
                                SELECT a ->> 'transactionId'
                                FROM jsonb_array_elements(p_acks) a))))
    ORDER BY p.id
    FOR NO KEY UPDATE;

    -- The messages are read without locking them: the update below applies a decision
    -- only to a row still as it was read (status, retry count and lease), and PostgreSQL
    -- re-checks that on the newest version of a row another transaction changed in the
    -- meantime (retention, an operator's retry or move: those lock the message, not the
    -- partition; the partition lock above keeps claims, other acks and lease expiry
    -- out). A row lock per message wrote a WAL record of its own, which every
    -- synchronous push behind it then flushed: without it a batch of 100 costs the ack
    -- 10 % less and pushes and pops beside it 4-7 %. The acknowledgments of rows that
    -- changed are decided again, on a fresh snapshot, in the next pass.
    FOR pass IN 1..10 LOOP
        WITH acks AS (
            SELECT DISTINCT ON (a ->> 'transactionId')
                   a ->> 'transactionId' AS txid, a ->> 'status' AS wanted, a ->> 'error' AS error
            FROM jsonb_array_elements(todo) WITH ORDINALITY t(a, ord)
            ORDER BY a ->> 'transactionId', t.ord DESC
        ), targets AS (
            SELECT a.*, m.status AS current, m.retry_count, m.partition_id, m.lease_id
            FROM acks a
            JOIN queen.messages m ON m.transaction_id = a.txid
            -- (Repeated as = ANY (ARRAY(...)): the join alone was planned as a hash over a
            -- sequential scan of every message while the table is small.)
            WHERE m.transaction_id = ANY (ARRAY(SELECT a ->> 'transactionId'
                                                FROM jsonb_array_elements(todo) a))
        ), decided AS (
            SELECT t.*, CASE
                WHEN t.wanted = 'completed' AND t.current IN ('processing', 'pending') THEN 'completed'
                WHEN t.wanted = 'failed' AND t.current = 'processing' THEN (
                    -- The queue's options only for a failure (a subquery in a branch runs
                    -- only when the branch is taken: completions look nothing up). Two
                    -- primary-key probes: as a join it was once planned as a merge join
                    -- walking every queue.
                    SELECT CASE WHEN t.retry_count + 1 <= q.retry_limit THEN 'pending'
                                WHEN q.dlq_after_max_retries THEN 'dead_letter'
                                ELSE 'failed' END
                    FROM queen.queues q
                    WHERE q.id = (SELECT p.queue_id FROM queen.partitions p
                                  WHERE p.id = t.partition_id))
                END AS next
            FROM targets t
        ), updated AS (
            UPDATE queen.messages m SET
                status = d.next,
                retry_count = CASE WHEN d.next = 'pending' THEN m.retry_count + 1 ELSE m.retry_count END,
                completed_at = CASE WHEN d.next = 'completed' THEN now() END,
                failed_at = CASE WHEN d.next = 'completed' THEN m.failed_at ELSE now() END,
                error_message = CASE WHEN d.next = 'completed' THEN m.error_message ELSE d.error END,
                lease_id = NULL, lease_expires_at = NULL,
                worker_id = CASE WHEN d.next = 'completed' THEN m.worker_id END
            FROM decided d
            WHERE m.transaction_id = d.txid AND d.next IS NOT NULL
              AND m.status = d.current AND m.retry_count = d.retry_count
              AND m.lease_id IS NOT DISTINCT FROM d.lease_id
            RETURNING m.transaction_id, m.status, m.retry_count, m.created_at, m.completed_at,
                      m.seq, d.current, d.partition_id, d.lease_id
        ), outcome AS (
            -- What each acknowledgment did: the rows updated, and the ones left as they were.
            -- (A union, not decided LEFT JOIN updated: both CTEs are estimated at a row or
            -- two, and the join was planned as a nested loop comparing every pair.)
            SELECT u.transaction_id AS txid, u.current, u.status AS next, u.retry_count,
                   u.partition_id, u.lease_id, u.seq,
                   extract(epoch FROM u.completed_at - u.created_at) * 1000 AS lag_ms
            FROM updated u
            UNION ALL
            SELECT d.txid, d.current, NULL, d.retry_count, d.partition_id, d.lease_id, NULL, NULL
            FROM decided d WHERE d.next IS NULL
        )
        SELECT array_agg(ROW(
            o.txid,
            CASE WHEN o.next = 'pending' THEN 'retry_scheduled'
                 WHEN o.next IS NOT NULL THEN o.next
                 WHEN o.current = 'pending' THEN 'retry_scheduled'
                 ELSE o.current END,
            o.retry_count, o.partition_id, o.lease_id,
            o.current = 'processing' AND o.next IS NOT NULL)::queen.ack_result),
               array_agg(ROW(o.partition_id, o.current, o.next, o.lag_ms)::queen.status_change)
                   FILTER (WHERE o.next IS NOT NULL),
               array_agg(o.partition_id) FILTER (WHERE o.next = 'pending'),
               array_agg(o.seq) FILTER (WHERE o.next = 'pending'),
               -- decisions the update did not apply: rows changed since they were read
               (SELECT count(*) FROM decided d WHERE d.next IS NOT NULL) - count(o.next)
        INTO found_r, found_c, found_p, found_s, skipped
        FROM outcome o;
        results := results || found_r;
        changes := changes || found_c;
        retried := retried || found_p;
        retried_seqs := retried_seqs || found_s;
        EXIT WHEN skipped = 0;
        -- Again for the acknowledgments without an outcome yet (the changed rows; unknown
        -- ids, found in no pass, come along and stay not found).
        SELECT jsonb_agg(t.a) INTO todo
        FROM jsonb_array_elements(todo) t(a)
        WHERE NOT t.a ->> 'transactionId' = ANY (ARRAY(SELECT r.transaction_id FROM unnest(found_r) r));
    END LOOP;
    PERFORM queen.record_changes(changes);
    IF retried IS NOT NULL THEN
        PERFORM queen.mark_pending(retried, retried_seqs, p_notify => false);
    END IF;

    -- A lease ends when the last message it covers is acknowledged: when this ack took
    -- every message the claim leased out of it (the usual batch ack) without looking,
    -- else when a walk of the lease's range finds none still in flight.
    WITH done AS (
        UPDATE queen.partitions p
        SET lease_id = NULL, lease_expires_at = NULL, leased_by = NULL, last_activity_at = now(),
            lease_first_seq = NULL, lease_last_seq = NULL, lease_size = NULL
        FROM (SELECT r.partition_id, r.lease_id, count(*) FILTER (WHERE r.ended) AS ended
              FROM unnest(results) r
              WHERE r.lease_id IS NOT NULL
              GROUP BY 1, 2) acked
        WHERE p.id = acked.partition_id AND p.lease_id = acked.lease_id
          AND (acked.ended = p.lease_size OR NOT queen.lease_open(p.id, acked.lease_id))
        RETURNING p.id
    )
    SELECT array_agg(d.id) INTO released FROM done d;
    -- A freed partition with pending work wakes a waiter (a push this snapshot cannot
    -- see yet notifies by itself when it commits).
    SELECT array_agg(x) INTO freed FROM unnest(released) x WHERE queen.pending_exists(x);
    IF freed IS NOT NULL THEN
        PERFORM queen.notify_partitions(freed);
    END IF;
    -- A freed partition without pending work leaves partition_heads, as in claim (the
    -- exclusive lock waits for pushes in flight; the delete re-checks on a fresh
    -- snapshot). Left there, drained partitions would use up the attempts of pop by queue.
    -- (One partition at a time: a probe of the primary key whatever the plan.)
    FOR drained IN
        SELECT x FROM unnest(released) x WHERE freed IS NULL OR NOT x = ANY (freed) ORDER BY x
    LOOP
        PERFORM pg_advisory_xact_lock(queen.partition_lock_key(drained));
        DELETE FROM queen.partition_heads h
        WHERE h.partition_id = drained AND NOT queen.pending_exists(drained);
    END LOOP;

    RETURN QUERY
    SELECT t.ord::integer, t.a ->> 'transactionId', coalesce(r.status, 'not_found'), r.retry_count
    FROM jsonb_array_elements(p_acks) WITH ORDINALITY t(a, ord)
    LEFT JOIN unnest(results) r ON r.transaction_id = t.a ->> 'transactionId'
    ORDER BY t.ord;
END
$$;

-- Plans of the hot path. PL/pgSQL keeps a statement's plan for the session, but while a
-- statement has parameters it re-plans it for each call's values ("custom" plans) as long
-- as that looks cheaper than one generic plan, and for these statements it always does:
-- planning was a third of the database time of a one-message push, pop or ack. Their
-- plans do not depend on the values (a partition, a lease, a batch of keys; the claim's
-- index walk is pinned by enable_bitmapscan = off), so they are planned once per session.
-- (Not pop_filtered: its "namespace IS NULL OR namespace = ..." needs the value to use an index.)
ALTER FUNCTION queen.push(jsonb, text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.pop_queue(text, integer, text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.pop_queue_id(uuid, integer, text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.pop_partition(text, text, integer, text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.pop_queue_preferring(text, text, integer, text)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.claim(uuid, integer, text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.ack(jsonb) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.release_lease(uuid, uuid, boolean) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.unclaim(uuid, text[]) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.mark_pending(uuid[], bigint[], boolean) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.notify_partitions(uuid[]) SET plan_cache_mode = force_generic_plan;

-- ---------------------------------------------------------------------------
-- Status accounting (migration 0002)
-- ---------------------------------------------------------------------------
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

-- ---------------------------------------------------------------------------
-- Maintenance (migration 0003)
-- ---------------------------------------------------------------------------
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

-- ---------------------------------------------------------------------------
-- Reads (migration 0004)
-- ---------------------------------------------------------------------------
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

-- ---------------------------------------------------------------------------
-- API tokens (migration 0005)
-- ---------------------------------------------------------------------------

-- One row per token made by `queen token create`. Only a SHA-256 hash of the token is
-- kept (the token itself is shown once); requests find their token by that hash.
-- A revoked token keeps its row, so its name stays taken and the producer recorded on
-- its messages keeps naming one token.
CREATE TABLE queen.tokens (
    name        text COLLATE "C" PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    role        text NOT NULL CHECK (role IN ('admin', 'producer', 'consumer', 'reader')),
    queues      text NOT NULL DEFAULT '*',            -- comma-separated fnmatch globs
    rate        double precision CHECK (rate > 0),    -- requests per second; NULL: no limit
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- The name of the token each message was pushed with (NULL without authentication).
ALTER TABLE queen.messages ADD COLUMN producer text;

-- Move the expiry of a live lease to now() + p_seconds (NULL: the queue's leaseTime), on
-- its partition and on its messages still in flight; return the new expiry, or NULL
-- when the lease is unknown, ended or already expired (expired leases are released by
-- maintenance, never revived). The partition row lock orders this against claims, acks
-- and expiry, which take it first too.
CREATE FUNCTION queen.extend_lease(p_lease uuid, p_seconds integer)
RETURNS timestamptz
LANGUAGE plpgsql
-- The lease's partition through partitions_leased, its messages through their seq range
-- (messages_partition_seq), whatever the statistics (see queen.lease_open).
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    part    record;
    expires timestamptz;
BEGIN
    SELECT p.id, p.lease_first_seq, p.lease_last_seq, q.lease_time INTO part
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE p.lease_id = p_lease AND p.lease_expires_at > now()
    FOR NO KEY UPDATE OF p;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    expires := now() + make_interval(secs => coalesce(p_seconds, part.lease_time));
    UPDATE queen.partitions p SET lease_expires_at = expires, last_activity_at = now()
    WHERE p.id = part.id;
    UPDATE queen.messages m SET lease_expires_at = expires
    WHERE m.partition_id = part.id
      AND m.seq BETWEEN part.lease_first_seq AND part.lease_last_seq
      AND m.status = 'processing' AND m.lease_id = p_lease;
    RETURN expires;
END
$$;

-- The cursor store (migration 0006; functions in sql/functions/cursor_*.sql)
-- ---------------------------------------------------------------------------
-- Messages are written once and never updated; what a consumer group has done with them
-- is one row per (partition, group): a cursor, a lease and the retry state past the
-- cursor. Failures and completions are records of their own, written when they happen.
-- The functions are in sql/functions/cursor_*.sql (installed on every migrate).

-- retryDelay: how long a failed message waits before its redelivery (ms); its
-- partition waits with it (FIFO).
ALTER TABLE queen.queues ADD COLUMN retry_delay integer NOT NULL DEFAULT 0;

-- Immutable messages. Ids come from one identity, drawn by a push while it holds its
-- partitions' push locks (queen.cursor_push_lock_key) until it commits: within a
-- partition, ids are in commit order, so a reader that sees a message has seen every
-- message of the partition with a lower id, and a cursor never passes one that commits
-- later.
CREATE TABLE queen.cursor_messages (
    id             bigint GENERATED ALWAYS AS IDENTITY,
    partition_id   uuid NOT NULL,                 -- queen.partitions (no key: see queen.messages)
    transaction_id text COLLATE "C" NOT NULL,     -- unique system-wide
    payload        jsonb NOT NULL,
    encrypted      boolean NOT NULL DEFAULT false,
    producer       text,                          -- the pushing token's name
    trace_id       text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, id),
    UNIQUE (transaction_id)
) WITH (
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- Consumer group metadata per queue: where a group's cursors start in a partition (at
-- the group's first pop of the queue; later modes are ignored). Queue mode is the group
-- '__queue__'.
CREATE TABLE queen.cursor_groups (
    queue_id          uuid NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    consumer_group    text COLLATE "C" NOT NULL,
    subscription_mode text NOT NULL CHECK (subscription_mode IN ('all', 'new', 'from')),
    subscription_from timestamptz,                -- 'new': created_at; 'from': the time asked
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, consumer_group)
);

-- One row per (partition, group): every message of the partition with id <= cursor_id is
-- done for the group (completed, dead-lettered or failed for good), and so are the ids in
-- done_ids (acked out of order, past a message that is to be retried). While lease_id is
-- set, the messages past the cursor up to lease_last_id (not in done_ids) are leased to
-- leased_by until lease_expires_at; lease_acked lists those acked so far. retried_max is
-- the highest id with a retry record (queen.cursor_failures) past the cursor: a pop looks
-- retry counts up only below it. not_before holds the partition back (retryDelay).
CREATE TABLE queen.cursor_consumers (
    partition_id     uuid NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    consumer_group   text COLLATE "C" NOT NULL,
    queue_id         uuid NOT NULL,
    cursor_id        bigint NOT NULL DEFAULT 0,
    done_ids         bigint[] NOT NULL DEFAULT '{}',
    retried_max      bigint NOT NULL DEFAULT 0,
    not_before       timestamptz,
    lease_id         uuid,
    leased_by        text,
    lease_expires_at timestamptz,
    lease_last_id    bigint,
    lease_size       integer,
    lease_acked      bigint[] NOT NULL DEFAULT '{}',
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group)
) WITH (fillfactor = 50);
CREATE INDEX cursor_consumers_group ON queen.cursor_consumers (queue_id, consumer_group);
-- No index covers a lease column: a pop and the ack that ends its lease then change no
-- indexed value, and PostgreSQL updates the row in place (HOT), with no index entry.
-- Lease extension and expiry read the table (one row per partition and group) instead.

-- A message's failures for one group, one row updated in place: status 'retry' while it
-- waits for redelivery with retry_count retries, 'dead_letter' or 'failed' for good.
CREATE TABLE queen.cursor_failures (
    partition_id   uuid NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    message_id     bigint NOT NULL,
    status         text NOT NULL CHECK (status IN ('retry', 'dead_letter', 'failed')),
    retry_count    integer NOT NULL,
    error          text,
    failed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group, message_id)
);
CREATE INDEX cursor_failures_final ON queen.cursor_failures (failed_at) WHERE status <> 'retry';

-- Completions: one row per ack call and (partition, group), covering the ids it
-- completed (first_id..last_id, count of them); never one row per message.
CREATE TABLE queen.cursor_completions (
    partition_id   uuid NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    first_id       bigint NOT NULL,
    last_id        bigint NOT NULL,
    acked          integer NOT NULL,
    acked_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cursor_completions_range
    ON queen.cursor_completions (partition_id, consumer_group, last_id);

-- What an acknowledgment of the cursor store decided (queen.cursor_ack; applied: it
-- changed something, rather than reporting what was already so).
CREATE TYPE queen.cursor_ack_outcome AS (
    idx integer, transaction_id text, consumer_group text, message_id bigint,
    status text, retry_count integer, error text, applied boolean
);

-- One item of a cursor push as stored (idx: its position in the request).
CREATE TYPE queen.cursor_push_item AS (
    idx integer, id bigint, transaction_id text, partition_id uuid, queue_id uuid,
    payload jsonb, encrypted boolean, trace_id text
);

-- What a pop of the cursor store returns for each message.
CREATE TYPE queen.cursor_popped AS (
    id bigint, transaction_id text, queue text, partition text, consumer_group text,
    payload jsonb, encrypted boolean, producer text, trace_id text, retry_count integer,
    created_at timestamptz, lease_id uuid, lease_expires_at timestamptz
);

-- Rollups of the cursor store for the read endpoints (migration 0009; functions in
-- sql/functions/cursor_reads.sql, cursor_counts.sql, cursor_admin.sql)

-- Queue mode's counts per partition up to two watermarks (see the migration).
CREATE TABLE queen.cursor_counts (
    partition_id   uuid PRIMARY KEY REFERENCES queen.partitions (id) ON DELETE CASCADE,
    counted_id     bigint NOT NULL DEFAULT 0,
    total          bigint NOT NULL DEFAULT 0,
    cursor_counted bigint NOT NULL DEFAULT 0,
    below          bigint NOT NULL DEFAULT 0,
    failed         bigint NOT NULL DEFAULT 0,
    dead_letter    bigint NOT NULL DEFAULT 0,
    refreshed_at   timestamptz NOT NULL DEFAULT '-infinity'
);

-- Activity of queue mode per minute and partition, as maintenance counts it: messages
-- created (by created_at), completed (by the time of their ack, with the sum and a
-- histogram of created -> acked in ms: bucket b holds [2^(b/2), 2^((b+1)/2)) ms),
-- failed and dead-lettered for good (by failed_at).
CREATE TABLE queen.cursor_metrics_minute (
    minute       timestamptz NOT NULL,
    partition_id uuid NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    incoming     bigint NOT NULL DEFAULT 0,
    completed    bigint NOT NULL DEFAULT 0,
    failed       bigint NOT NULL DEFAULT 0,
    dead_letter  bigint NOT NULL DEFAULT 0,
    lag_ms       bigint NOT NULL DEFAULT 0,
    lag_hist     integer[] NOT NULL DEFAULT array_fill(0, ARRAY[64]),
    PRIMARY KEY (minute, partition_id)
);

-- Deleted messages (retention, admin delete, clear) leave the counts and take their
-- failure records along. A statement trigger: pushes do not fire it. Its body is
-- replaced by sql/functions/cursor_reads.sql on every migrate.
CREATE FUNCTION queen.cursor_messages_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER cursor_messages_deleted AFTER DELETE ON queen.cursor_messages
REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
EXECUTE FUNCTION queen.cursor_messages_deleted();
