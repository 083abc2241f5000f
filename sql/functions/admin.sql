-- Operator actions on single messages and partitions: delete, retry, dead-letter, clear.
-- Messages stay immutable: an action deletes rows (and a retry writes the message
-- again); cursor invariants hold for every group of the partition.

-- After message p_id of a partition was deleted: every group forgets it (done ids, the
-- lease it was in: one message fewer to ack), and moves its cursor over what is done
-- (a lease left with nothing to ack ends).
CREATE OR REPLACE FUNCTION queen.forget_message(p_partition uuid, p_id bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c queen.consumers;
BEGIN
    FOR c IN SELECT * FROM queen.consumers x WHERE x.partition_id = p_partition
             ORDER BY x.consumer_group FOR UPDATE
    LOOP
        CONTINUE WHEN p_id <= c.cursor_id;
        UPDATE queen.consumers x SET
            lease_size = CASE WHEN x.lease_id IS NOT NULL AND p_id <= x.lease_last_id
                                   AND (p_id = ANY (x.lease_acked) OR p_id <> ALL (x.done_ids))
                              THEN x.lease_size - 1 ELSE x.lease_size END,
            lease_digest = CASE WHEN p_id <= x.lease_last_id THEN NULL ELSE x.lease_digest END,
            lease_acked = array_remove(x.lease_acked, p_id),
            done_ids = array_remove(x.done_ids, p_id)
        WHERE x.partition_id = p_partition AND x.consumer_group = c.consumer_group;
        PERFORM queen.settle(p_partition, c.consumer_group, '{}', '{}', NULL);
    END LOOP;
END
$$;

-- Queue mode's status of a message, its consumer rows locked (by the caller).
CREATE OR REPLACE FUNCTION queen.message_status_of(p_partition uuid, p_id bigint) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT r.status FROM queen.message_rows(ARRAY[p_partition], ARRAY[p_id]) r
$$;

-- The message of transactionId p_txid (a row of NULLs when there is none), once every
-- consumer row of its partition is locked, in group order: an operator's change then
-- waits for the acks and pops under way there, and they for it.
CREATE OR REPLACE FUNCTION queen.lock_message(p_txid text)
RETURNS queen.messages
LANGUAGE plpgsql AS $$
DECLARE
    m queen.messages;
BEGIN
    SELECT x.* INTO m FROM queen.named(p_txid) n
    JOIN queen.messages x ON x.partition_id = n.partition_id AND x.id = n.id;
    IF FOUND THEN
        PERFORM 1 FROM queen.consumers c WHERE c.partition_id = m.partition_id
        ORDER BY c.consumer_group FOR UPDATE;
    END IF;
    RETURN m;
END
$$;

-- Delete one message; queue mode's status it had, or NULL when there is no such message.
CREATE OR REPLACE FUNCTION queen.delete_message(p_txid text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    m      queen.messages;
    status text;
BEGIN
    m := queen.lock_message(p_txid);
    IF m.id IS NULL THEN
        RETURN NULL;
    END IF;
    status := queen.message_status_of(m.partition_id, m.id);
    DELETE FROM queen.messages x WHERE x.partition_id = m.partition_id AND x.id = m.id;
    IF NOT FOUND THEN
        RETURN NULL;  -- (deleted meanwhile)
    END IF;
    PERFORM queen.forget_message(m.partition_id, m.id);
    RETURN status;
END
$$;

-- Put message m (failed or dead-lettered for queue mode, its consumer row c locked) back
-- in its place for queue mode: its record goes (retryCount 0), it leaves the done ids,
-- and a cursor past it moves back before it, the done messages it steps back over
-- joining the done ids (at most p_max of them: else nothing changes and it returns
-- false). Within a lease's range it counts as a message of the lease acked for a retry,
-- so it comes first once the lease ends.
CREATE OR REPLACE FUNCTION queen.retry_in_place(m queen.messages,
                                                c queen.consumers, p_max integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    passed bigint[] := '{}';
    back_to bigint := c.cursor_id;
    ranged boolean;
BEGIN
    IF m.id <= c.cursor_id THEN
        passed := ARRAY(SELECT x.id FROM queen.messages x
                        WHERE x.partition_id = m.partition_id AND x.id > m.id
                          AND x.id <= c.cursor_id
                        ORDER BY x.id LIMIT p_max + 1);
        IF cardinality(passed) > p_max THEN
            RETURN false;
        END IF;
        back_to := m.id - 1;
    END IF;
    ranged := c.lease_id IS NOT NULL AND m.id <= c.lease_last_id AND m.id <> ALL (c.lease_acked);
    PERFORM queen.counts_lock(ARRAY[m.partition_id]);
    PERFORM queen.counts_step_back(m.partition_id, back_to);
    WITH gone AS (
        DELETE FROM queen.failures f
        WHERE f.partition_id = m.partition_id AND f.consumer_group = '__queue__'
          AND f.message_id = m.id
        RETURNING f.status
    )
    UPDATE queen.partition_counts k SET
        failed = k.failed - (SELECT count(*) FROM gone WHERE gone.status = 'failed'),
        dead_letter = k.dead_letter - (SELECT count(*) FROM gone WHERE gone.status = 'dead_letter')
    WHERE k.partition_id = m.partition_id AND m.id <= k.cursor_counted;
    UPDATE queen.consumers x SET
        cursor_id = back_to,
        done_ids = ARRAY(SELECT d FROM unnest(passed || x.done_ids) d WHERE d <> m.id ORDER BY d),
        lease_acked = CASE WHEN ranged THEN x.lease_acked || m.id ELSE x.lease_acked END,
        lease_size = CASE WHEN ranged THEN x.lease_size + 1 ELSE x.lease_size END,
        lease_digest = CASE WHEN ranged THEN NULL ELSE x.lease_digest END,
        updated_at = now()
    WHERE x.partition_id = m.partition_id AND x.consumer_group = '__queue__';
    RETURN true;
END
$$;

-- Write message m again at the tail of its partition for queue mode (a retry too far
-- back to make in place): same transactionId, payload and created_at, a new id. The
-- other groups keep what they had: where it was done it is done again, their failure
-- records move along.
CREATE OR REPLACE FUNCTION queen.retry_at_tail(m queen.messages) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    fresh   bigint;
    kept    queen.failures[];
    done_in text[];
BEGIN
    -- A new id of the partition, drawn as a push draws one (docs/STORAGE.md, push lock).
    PERFORM pg_advisory_xact_lock(queen.push_lock_key(m.partition_id));
    kept := ARRAY(SELECT f FROM queen.consumers c
                  JOIN queen.failures f
                    ON f.partition_id = c.partition_id AND f.consumer_group = c.consumer_group
                   AND f.message_id = m.id
                  WHERE c.partition_id = m.partition_id AND c.consumer_group <> '__queue__');
    done_in := ARRAY(SELECT c.consumer_group FROM queen.consumers c
                     WHERE c.partition_id = m.partition_id AND c.consumer_group <> '__queue__'
                       AND (m.id <= c.cursor_id OR m.id = ANY (c.done_ids)));
    DELETE FROM queen.messages x WHERE x.partition_id = m.partition_id AND x.id = m.id;
    INSERT INTO queen.messages
        (partition_id, transaction_id, payload, encrypted, producer, trace_id, created_at)
    VALUES (m.partition_id, queen.txid(m.transaction_id, m.partition_id, m.id), m.payload,
            m.encrypted, m.producer, m.trace_id, m.created_at)
    RETURNING id INTO fresh;
    INSERT INTO queen.failures
        (partition_id, consumer_group, message_id, status, retry_count, error, failed_at)
    SELECT k.partition_id, k.consumer_group, fresh, k.status, k.retry_count, k.error, k.failed_at
    FROM unnest(kept) k;
    UPDATE queen.consumers c SET
        done_ids = CASE WHEN c.consumer_group = ANY (done_in) THEN c.done_ids || fresh
                        ELSE c.done_ids END,
        retried_max = CASE WHEN EXISTS (SELECT 1 FROM unnest(kept) k
                                        WHERE k.consumer_group = c.consumer_group
                                          AND k.status = 'retry')
                           THEN fresh ELSE c.retried_max END
    WHERE c.partition_id = m.partition_id AND c.consumer_group <> '__queue__';
    PERFORM queen.forget_message(m.partition_id, m.id);
END
$$;

-- Retry a message failed or dead-lettered for queue mode: it is delivered to queue mode
-- again, retryCount 0, in its place (before the messages after it that are not done),
-- unless more than p_in_place messages after it are done: then it is written again at
-- the tail. Returns queue mode's status before (only failed / dead_letter ones move);
-- NULL: no such message.
CREATE OR REPLACE FUNCTION queen.retry_message(p_txid text, p_in_place integer DEFAULT 1000)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    m      queen.messages;
    c      queen.consumers;
    status text;
BEGIN
    m := queen.lock_message(p_txid);
    IF m.id IS NULL THEN
        RETURN NULL;
    END IF;
    status := queen.message_status_of(m.partition_id, m.id);
    IF status IS NULL OR status NOT IN ('failed', 'dead_letter') THEN
        RETURN status;
    END IF;
    SELECT * INTO c FROM queen.consumers x
    WHERE x.partition_id = m.partition_id AND x.consumer_group = '__queue__';
    IF NOT queen.retry_in_place(m, c, p_in_place) THEN
        PERFORM queen.retry_at_tail(m);
    END IF;
    PERFORM queen.wake(ARRAY[m.partition_id]);
    RETURN status;
END
$$;

-- Move a message pending or failed for queue mode to its dead letter queue (a pending
-- one is then done: its cursor moves on). Returns the status before (only pending /
-- failed ones move); NULL: no such message.
CREATE OR REPLACE FUNCTION queen.dead_letter_message(p_txid text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    m      queen.messages;
    queue  uuid;
    status text;
BEGIN
    SELECT x.* INTO m FROM queen.named(p_txid) n
    JOIN queen.messages x ON x.partition_id = n.partition_id AND x.id = n.id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT p.queue_id INTO queue FROM queen.partitions p WHERE p.id = m.partition_id;
    PERFORM queen.join_group(queue, '__queue__', NULL, NULL);
    PERFORM queen.ensure_cursors(queue, '__queue__', m.partition_id);
    PERFORM 1 FROM queen.consumers c
    WHERE c.partition_id = m.partition_id AND c.consumer_group = '__queue__' FOR UPDATE;
    status := queen.message_status_of(m.partition_id, m.id);
    IF status = 'failed' THEN
        PERFORM queen.counts_lock(ARRAY[m.partition_id]);
        UPDATE queen.failures f SET status = 'dead_letter'
        WHERE f.partition_id = m.partition_id AND f.consumer_group = '__queue__'
          AND f.message_id = m.id;
        UPDATE queen.partition_counts k SET failed = k.failed - 1, dead_letter = k.dead_letter + 1
        WHERE k.partition_id = m.partition_id AND m.id <= k.cursor_counted;
    ELSIF status = 'pending' THEN
        INSERT INTO queen.failures AS f
            (partition_id, consumer_group, message_id, status, retry_count, error)
        VALUES (m.partition_id, '__queue__', m.id, 'dead_letter',
                queen.retries_of(m.partition_id, '__queue__', m.id, 9223372036854775807),
                'moved to dead letter queue')
        ON CONFLICT (partition_id, consumer_group, message_id) DO UPDATE
        SET status = 'dead_letter', error = coalesce(f.error, EXCLUDED.error), failed_at = now();
        PERFORM queen.settle(m.partition_id, '__queue__', ARRAY[m.id], '{}', NULL);
    END IF;
    RETURN status;
END
$$;

-- Delete every message of a queue, or of one of its partitions, with every group's
-- records of them; leases end, cursors stay (later messages have higher ids). Returns
-- the number deleted; NULL when the queue (or the partition) does not exist.
CREATE OR REPLACE FUNCTION queen.clear_messages(p_queue text, p_partition text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    targets uuid[];
    cleared bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queen.queues q WHERE q.name = p_queue) THEN
        RETURN NULL;
    END IF;
    targets := ARRAY(SELECT p.id FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
                     WHERE q.name = p_queue AND (p_partition IS NULL OR p.name = p_partition)
                     ORDER BY p.id);
    IF p_partition IS NOT NULL AND cardinality(targets) = 0 THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM queen.consumers c WHERE c.partition_id = ANY (targets)
    ORDER BY c.partition_id, c.consumer_group FOR UPDATE;
    PERFORM queen.counts_lock(targets);
    -- Failure records first, in bulk (the delete trigger then has none to look up).
    DELETE FROM queen.failures f WHERE f.partition_id = ANY (targets);
    UPDATE queen.partition_counts k SET failed = 0, dead_letter = 0
    WHERE k.partition_id = ANY (targets);
    DELETE FROM queen.messages m WHERE m.partition_id = ANY (targets);
    GET DIAGNOSTICS cleared = ROW_COUNT;
    UPDATE queen.consumers c SET
        done_ids = '{}', retried_max = 0, not_before = NULL, lease_id = NULL, leased_by = NULL,
        lease_expires_at = NULL, lease_last_id = NULL, lease_size = NULL, lease_digest = NULL,
        lease_acked = '{}', updated_at = now()
    WHERE c.partition_id = ANY (targets);
    RETURN cleared;
END
$$;

-- Delete a queue: its messages, every group's records of them, its partitions, cursors,
-- leases, counts and consumer groups. Each partition's push lock is taken first (in id
-- order, waiting for pushes in flight), so no push commits into a partition being
-- removed; a push that comes after finds no queue and makes it again, as for any new
-- queue. Returns the number of messages deleted; NULL when the queue does not exist.
CREATE OR REPLACE FUNCTION queen.delete_queue(p_queue text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    q       queen.queues;
    targets uuid[];
    deleted bigint;
BEGIN
    SELECT * INTO q FROM queen.queues x WHERE x.name = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    targets := ARRAY(SELECT p.id FROM queen.partitions p WHERE p.queue_id = q.id ORDER BY p.id);
    PERFORM pg_advisory_xact_lock(queen.push_lock_key(x)) FROM unnest(targets) x;
    DELETE FROM queen.failures f WHERE f.partition_id = ANY (targets);
    DELETE FROM queen.completions k WHERE k.partition_id = ANY (targets);
    DELETE FROM queen.messages m WHERE m.partition_id = ANY (targets);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    DELETE FROM queen.queues x WHERE x.id = q.id;  -- (partitions and the rest by their keys)
    RETURN deleted;
END
$$;
