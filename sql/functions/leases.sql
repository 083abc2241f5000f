-- Leases: a partition leased to one consumer of a group at a time, its end (all acked,
-- or expired), what moves the cursor, extension and give-back.

-- The digest of a lease's transactionIds (p_n of them) joined in delivery order by
-- U+001F (p_joined), which queen.ack_whole_leases compares with an ack's. NULL when a
-- transactionId holds the separator: joined, two lists could then read alike. (The
-- separator is one byte, which no character of another spans in any server encoding:
-- counted in bytes, not characters, which would read the text twice more.)
CREATE OR REPLACE FUNCTION queen.lease_digest(p_joined text, p_n integer) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_n > 0
                     AND octet_length(p_joined)
                         - octet_length(replace(p_joined, E'\x1f', '')) = p_n - 1
                THEN hashtextextended(p_joined, 0) END
$$;

-- The retries a message has had for a group (0 unless a failure record says otherwise;
-- looked up only at or below the group's retried_max in the partition). (PL/pgSQL: a SQL
-- function with a subquery is never inlined, and one that is not is parsed and planned
-- again in every transaction; PL/pgSQL keeps its plan for the session.)
CREATE OR REPLACE FUNCTION queen.retries_of(p_partition uuid, p_group text, p_id bigint,
                                            p_retried_max bigint)
RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_retried_max IS NULL OR p_id > p_retried_max THEN
        RETURN 0;
    END IF;
    RETURN coalesce((SELECT f.retry_count FROM queen.failures f
                     WHERE f.partition_id = p_partition AND f.consumer_group = p_group
                       AND f.message_id = p_id AND f.status = 'retry'), 0);
END
$$;

-- Where a cursor can move: past every message of the partition done for the group (at or
-- below p_cursor, or in p_done) up to the first one that is not. Only committed messages
-- are seen, and a message committing later has a higher id than all of them.
CREATE OR REPLACE FUNCTION queen.next_cursor(p_partition uuid, p_cursor bigint, p_done bigint[])
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    undone bigint;
BEGIN
    IF cardinality(p_done) = 0 THEN
        RETURN p_cursor;
    END IF;
    SELECT m.id INTO undone FROM queen.messages m
    WHERE m.partition_id = p_partition AND m.id > p_cursor AND m.id <> ALL (p_done)
    ORDER BY m.id LIMIT 1;
    IF undone IS NULL THEN
        RETURN greatest(p_cursor, (SELECT max(d) FROM unnest(p_done) d));
    END IF;
    RETURN greatest(p_cursor, undone - 1);
END
$$;

-- Record messages done (p_done) and acked (p_acked) for a group's partition, whose row
-- the caller has locked; end the lease when all its messages are acked (or p_expired),
-- move the cursor over what is done, and start retryDelay when a message of the ended
-- lease waits for a retry. Wakes a poll when the partition is free with work (not when
-- the lease took the last of it: nobody could pop anything). Returns
-- whether the lease ended.
CREATE OR REPLACE FUNCTION queen.settle(p_partition uuid, p_group text, p_done bigint[],
                                        p_acked bigint[], p_retried bigint,
                                        p_expired boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    c        queen.consumers;
    delay_ms integer;
BEGIN
    SELECT * INTO c FROM queen.consumers x
    WHERE x.partition_id = p_partition AND x.consumer_group = p_group;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT q.retry_delay INTO delay_ms FROM queen.queues q WHERE q.id = c.queue_id;
    RETURN queen.settle_row(c, delay_ms, p_done, p_acked, p_retried, p_expired);
END
$$;

-- queen.settle given the group's row c as the caller locked and read it, and its
-- queue's retryDelay (ms): the row is not read again.
CREATE OR REPLACE FUNCTION queen.settle_row(c queen.consumers, p_delay_ms integer,
                                            p_done bigint[], p_acked bigint[],
                                            p_retried bigint,
                                            p_expired boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    done     bigint[] := c.done_ids || p_done;
    acked    bigint[] := c.lease_acked || p_acked;
    moved_to bigint := c.cursor_id;
    ended    boolean;
    retrying boolean;
BEGIN
    ended := c.lease_id IS NOT NULL AND (p_expired OR cardinality(acked) >= c.lease_size);
    -- A message retried in this lease: acked (failed) but not done. (<@ compares every
    -- pair, quadratic in the lease's size; a call that does what it acks needs none.)
    retrying := p_retried IS NOT NULL
                OR CASE WHEN cardinality(c.lease_acked) = 0 AND p_acked = p_done THEN false
                        ELSE NOT acked <@ done END;
    IF ended AND NOT retrying THEN
        moved_to := greatest(moved_to, c.lease_last_id);  -- every message of it done
        done := ARRAY(SELECT d FROM unnest(done) d WHERE d > moved_to ORDER BY d);
    END IF;
    IF cardinality(done) > 0 THEN
        moved_to := queen.next_cursor(c.partition_id, moved_to, done);
        done := ARRAY(SELECT d FROM unnest(done) d WHERE d > moved_to ORDER BY d);
    END IF;
    UPDATE queen.consumers x SET
        cursor_id = moved_to,
        done_ids = done,
        retried_max = greatest(c.retried_max, coalesce(p_retried, 0)),
        lease_acked = CASE WHEN ended THEN '{}' ELSE acked END,
        lease_id = CASE WHEN ended THEN NULL ELSE x.lease_id END,
        leased_by = CASE WHEN ended THEN NULL ELSE x.leased_by END,
        lease_expires_at = CASE WHEN ended THEN NULL ELSE x.lease_expires_at END,
        lease_last_id = CASE WHEN ended THEN NULL ELSE x.lease_last_id END,
        lease_size = CASE WHEN ended THEN NULL ELSE x.lease_size END,
        lease_digest = CASE WHEN ended THEN NULL ELSE x.lease_digest END,
        not_before = CASE WHEN ended AND retrying AND p_delay_ms > 0
                          THEN now() + make_interval(secs => p_delay_ms / 1000.0)
                          ELSE x.not_before END,
        updated_at = now()
    WHERE x.partition_id = c.partition_id AND x.consumer_group = c.consumer_group;
    IF ended AND (p_delay_ms = 0 OR NOT retrying) THEN
        PERFORM queen.wake_group_if_work(c.partition_id, c.consumer_group, moved_to);
    END IF;
    RETURN ended;
END
$$;

-- End an expired lease of a group's partition (the caller holds its row lock): its
-- un-acked messages get retryCount + 1, or go to dead_letter / failed past the queue's
-- retryLimit; the cursor moves over what is done. Returns the messages given back.
CREATE OR REPLACE FUNCTION queen.release_expired(p_partition uuid, p_group text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    c       queen.consumers;
    unacked bigint[];
    final   bigint[];
BEGIN
    SELECT * INTO c FROM queen.consumers x
    WHERE x.partition_id = p_partition AND x.consumer_group = p_group;
    IF c.lease_id IS NULL THEN
        RETURN 0;
    END IF;
    unacked := ARRAY(SELECT m.id FROM queen.messages m
                     WHERE m.partition_id = p_partition AND m.id > c.cursor_id
                       AND m.id <= c.lease_last_id AND m.id <> ALL (c.done_ids)
                       AND m.id <> ALL (c.lease_acked)
                     ORDER BY m.id);
    final := queen.record_failures(p_partition, p_group, unacked,
                                   array_fill('lease expired'::text, ARRAY[cardinality(unacked)]),
                                   c.retried_max);
    PERFORM queen.settle(p_partition, p_group, final, '{}',
                         CASE WHEN cardinality(final) < cardinality(unacked)
                                     THEN c.lease_last_id END,
                                p_expired => true);
    RETURN cardinality(unacked);
END
$$;

-- Record one more failure of each of p_ids (with p_errors) for a group: status 'retry' with the count
-- of retries, or 'dead_letter' / 'failed' (dlqAfterMaxRetries) past the retryLimit.
-- Returns the ids now done for good. (PL/pgSQL, for a plan kept for the session, as
-- queen.retries_of.)
CREATE OR REPLACE FUNCTION queen.record_failures(p_partition uuid, p_group text, p_ids bigint[],
                                                 p_errors text[], p_retried_max bigint)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    final bigint[];
BEGIN
    WITH q AS (
        SELECT q.retry_limit, q.dlq_after_max_retries
        FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
        WHERE p.id = p_partition
    ), tried AS (
        SELECT i.id, i.error, queen.retries_of(p_partition, p_group, i.id, p_retried_max) AS n
        FROM unnest(p_ids, p_errors) i(id, error)
    ), recorded AS (
        INSERT INTO queen.failures AS f
            (partition_id, consumer_group, message_id, status, retry_count, error)
        SELECT p_partition, p_group, t.id,
               CASE WHEN t.n + 1 <= q.retry_limit THEN 'retry'
                    WHEN q.dlq_after_max_retries THEN 'dead_letter' ELSE 'failed' END,
               CASE WHEN t.n + 1 <= q.retry_limit THEN t.n + 1 ELSE t.n END, t.error
        FROM tried t CROSS JOIN q
        ORDER BY t.id
        ON CONFLICT (partition_id, consumer_group, message_id) DO UPDATE
        SET status = EXCLUDED.status, retry_count = EXCLUDED.retry_count,
            error = EXCLUDED.error, failed_at = now()
        RETURNING f.message_id, f.status
    )
    SELECT coalesce(array_agg(r.message_id ORDER BY r.message_id)
                    FILTER (WHERE r.status <> 'retry'), '{}')
    INTO final
    FROM recorded r;
    RETURN final;
END
$$;

-- Extend a live lease to p_seconds from now (NULL: its queue's leaseTime); the new
-- expiry, or NULL when the lease is unknown or has ended (or expired). The row is found
-- by the key range its id names (queen.lease_in). One plan per session (plan_cache_mode).
CREATE OR REPLACE FUNCTION queen.extend_lease(p_lease uuid, p_seconds integer)
RETURNS timestamptz
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    expires timestamptz;
BEGIN
    UPDATE queen.consumers c
    SET lease_expires_at = now() + make_interval(secs => coalesce(p_seconds, q.lease_time)),
        updated_at = now()
    FROM queen.queues q
    WHERE c.partition_id BETWEEN queen.lease_low(p_lease) AND queen.lease_high(p_lease)
      AND c.lease_id = p_lease AND c.lease_expires_at > now() AND q.id = c.queue_id
    RETURNING c.lease_expires_at INTO expires;
    RETURN expires;
END
$$;

-- Give back a lease whose pop never reached its consumer (the response was not
-- delivered, or the connection broke after the pop committed): the lease ends WITHOUT
-- counting an attempt, and its messages not acked are the partition's next ones again,
-- at once (no retryDelay). What was acked under it stays as acked. Returns the messages
-- given back; 0 when the lease is unknown or ended (by an ack, expiry or a seek).
CREATE OR REPLACE FUNCTION queen.give_back(p_lease uuid) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    c queen.consumers;
BEGIN
    -- (No index covers lease_id: the row is found by the key range the id names. An id
    -- of another making is the one the claim was made under, whose last 8 bytes the
    -- lease's keeps: every row is read for it, as only a lost answer's give-back needs.)
    IF queen.lease_placed(p_lease) THEN
        SELECT * INTO c FROM queen.consumers x
        WHERE x.partition_id BETWEEN queen.lease_low(p_lease) AND queen.lease_high(p_lease)
          AND x.lease_id = p_lease
        FOR UPDATE;
    ELSE
        SELECT * INTO c FROM queen.consumers x
        WHERE substring(uuid_send(x.lease_id) FROM 9) = substring(uuid_send(p_lease) FROM 9)
        FOR UPDATE;
    END IF;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    UPDATE queen.consumers x SET
        lease_id = NULL, leased_by = NULL, lease_expires_at = NULL, lease_last_id = NULL,
        lease_size = NULL, lease_digest = NULL, lease_acked = '{}', updated_at = now()
    WHERE x.partition_id = c.partition_id AND x.consumer_group = c.consumer_group;
    IF EXISTS (SELECT 1 FROM queen.waiting_workers w WHERE w.until > now()) THEN
        PERFORM queen.wake_group(c.partition_id, c.consumer_group);
    END IF;
    RETURN c.lease_size - cardinality(c.lease_acked);
END
$$;

-- The queue a live lease is on (NULL: unknown or ended), for a queue-limited token.
CREATE OR REPLACE FUNCTION queen.lease_queue(p_lease uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT q.name FROM queen.consumers c JOIN queen.queues q ON q.id = c.queue_id
    WHERE c.partition_id BETWEEN queen.lease_low(p_lease) AND queen.lease_high(p_lease)
      AND c.lease_id = p_lease
$$;

-- Give back the lease of a pop whose answer was lost with its connection (GiveBacks,
-- queen/store/giveback.py): the pop may have committed, or may still be running. Once
-- the backend that ran it (p_backend) is gone, the lease is given back as by
-- queen.give_back (no attempt counted). While that backend is there it is asked to
-- end, waiting up to a second; NULL then means "not yet, call again" (a give-back before
-- the pop committed would find nothing, and the pop's lease would then expire into a
-- retry). p_server_started is pg_postmaster_start_time() of the server that ran the pop:
-- on another server (a promoted standby) or after a restart the process id names some
-- other session, and that backend is gone anyway.
CREATE OR REPLACE FUNCTION queen.give_back_claim(
    p_lease uuid, p_backend integer, p_server_started timestamptz
)
RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    IF p_backend <> pg_backend_pid()
       AND p_server_started IS NOT DISTINCT FROM pg_postmaster_start_time()
       AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = p_backend)
       AND NOT pg_terminate_backend(p_backend, 1000) THEN
        RETURN NULL;
    END IF;
    RETURN queen.give_back(p_lease);
END
$$;

-- (An earlier build found the row of a whole lease's ack with a function of its own: the
-- server's statements now find it in the key range it computes.)
DROP FUNCTION IF EXISTS queen.lease_row(uuid, text);
