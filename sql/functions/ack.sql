-- Acknowledgments: decided per (partition, group) under its row lock; a batch's items
-- are grouped so that each consumer row is locked once.

-- Decide and apply the acknowledgments of one group's partition (p_items: the request's
-- items for it, as {idx, txid, id, wanted, error, lease}); the row is locked here. A
-- message acked twice in one call is decided once, by its last acknowledgment. A message
-- deleted since the caller found it (admin delete or clear, which wait for this row
-- lock, or hold it) is left out, so its item is not_found: counted as acked, it would
-- end the lease before the rest of it was acked, and the cursor would pass those.
CREATE OR REPLACE FUNCTION queen.cursor_ack_consumer(p_partition uuid, p_group text, p_items jsonb)
RETURNS queen.cursor_ack_outcome[]
LANGUAGE plpgsql AS $$
DECLARE
    c       queen.cursor_consumers;
    q       queen.queues;
    decided queen.cursor_ack_outcome[];
    failed  bigint[];
    errors  text[];
BEGIN
    SELECT * INTO c FROM queen.cursor_consumers x
    WHERE x.partition_id = p_partition AND x.consumer_group = p_group FOR UPDATE;
    SELECT * INTO q FROM queen.queues x WHERE x.id = c.queue_id;
    SELECT array_agg(ROW(i.idx, i.txid, p_group, i.id, d.status,
                         CASE WHEN d.status = 'retry_scheduled' AND d.applied THEN i.tries + 1
                              ELSE i.tries END,
                         i.error, d.applied)::queen.cursor_ack_outcome)
    INTO decided
    FROM (SELECT DISTINCT ON (x.id) x.*,
                 CASE WHEN x.id > c.retried_max THEN 0  -- (no retry record: no lookup)
                      ELSE queen.cursor_retries(p_partition, p_group, x.id, c.retried_max)
                 END AS tries
          FROM jsonb_to_recordset(p_items) x(idx integer, txid text, id bigint, wanted text,
                                             error text, lease uuid)
          -- One probe of the key per item (as an EXISTS, the planner may hash-join the
          -- items against every message of the partition: 0.5 ms an ack at 1,250).
          CROSS JOIN LATERAL (SELECT 1 FROM queen.cursor_messages m
                              WHERE m.partition_id = p_partition AND m.id = x.id LIMIT 1) kept
          ORDER BY x.id, x.idx DESC) i
    CROSS JOIN LATERAL queen.cursor_decide(c, q, i.id, i.wanted, i.lease, i.tries) d;

    SELECT array_agg(d.message_id), array_agg(d.error) INTO failed, errors
    FROM unnest(decided) d WHERE d.applied AND d.status <> 'completed';
    IF failed IS NOT NULL THEN
        PERFORM queen.cursor_fail(p_partition, p_group, failed, errors, c.retried_max);
    END IF;
    INSERT INTO queen.cursor_completions (partition_id, consumer_group, first_id, last_id, acked)
    SELECT p_partition, p_group, min(d.message_id), max(d.message_id), count(*)
    FROM unnest(decided) d WHERE d.applied AND d.status = 'completed'
    HAVING count(*) > 0;
    IF EXISTS (SELECT 1 FROM unnest(decided) d WHERE d.applied) THEN
        PERFORM queen.cursor_settle(
            p_partition, p_group,
            ARRAY(SELECT d.message_id FROM unnest(decided) d
                  WHERE d.applied AND d.status <> 'retry_scheduled'),
            ARRAY(SELECT d.message_id FROM unnest(decided) d WHERE d.applied),
            (SELECT max(d.message_id) FROM unnest(decided) d
             WHERE d.applied AND d.status = 'retry_scheduled'));
    END IF;
    IF cardinality(decided) = jsonb_array_length(p_items) THEN
        RETURN decided;
    END IF;
    -- A message acked more than once in the call: each of its items gets the outcome.
    RETURN ARRAY(SELECT ROW(x.idx, d.transaction_id, d.consumer_group, d.message_id, d.status,
                            d.retry_count, d.error, d.applied)::queen.cursor_ack_outcome
                 FROM jsonb_to_recordset(p_items) x(idx integer, id bigint)
                 JOIN unnest(decided) d ON d.message_id = x.id);
END
$$;

-- What an acknowledgment of message p_id does, given the group's row c and queue q:
-- a leaseId that is not the lease -> lease_expired; already done -> its status; outside
-- the lease -> lease_expired; acked failed before in this lease -> retry_scheduled;
-- else completed, or a failure: retry_scheduled, dead_letter or failed (retryLimit counts
-- retries after the first delivery).
CREATE OR REPLACE FUNCTION queen.cursor_decide(c queen.cursor_consumers, q queen.queues,
                                               p_id bigint, p_wanted text, p_lease uuid,
                                               p_tries integer)
RETURNS TABLE (status text, applied boolean)
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_lease IS NOT NULL AND p_lease IS DISTINCT FROM c.lease_id THEN 'lease_expired'
        WHEN p_id <= c.cursor_id OR p_id = ANY (c.done_ids) THEN coalesce(
            (SELECT f.status FROM queen.cursor_failures f
             WHERE f.partition_id = c.partition_id AND f.consumer_group = c.consumer_group
               AND f.message_id = p_id AND f.status <> 'retry'), 'completed')
        WHEN c.lease_id IS NULL OR p_id > c.lease_last_id THEN 'lease_expired'
        WHEN p_id = ANY (c.lease_acked) THEN 'retry_scheduled'
        WHEN p_wanted = 'completed' THEN 'completed'
        WHEN p_tries + 1 <= q.retry_limit THEN 'retry_scheduled'
        WHEN q.dlq_after_max_retries THEN 'dead_letter'
        ELSE 'failed' END,
    NOT (p_lease IS NOT NULL AND p_lease IS DISTINCT FROM c.lease_id)
        AND NOT coalesce(p_id <= c.cursor_id OR p_id = ANY (c.done_ids), false)
        AND c.lease_id IS NOT NULL AND p_id <= c.lease_last_id
        AND NOT p_id = ANY (c.lease_acked)
$$;

-- Acknowledge a batch: [{"transactionId", "status": "completed"|"failed", "error",
-- "consumerGroup" (default queue mode), "leaseId" (optional: without it, the current
-- lease of the message's partition and group)}]. One row per item, in item order:
-- completed / retry_scheduled (with retryCount) / dead_letter / failed / lease_expired /
-- not_found, and whether it changed something (applied) or only reported what was already
-- so (a message done before, or acked before in its lease): the transaction endpoint
-- refuses the latter, since the work it commits with the ack would then be done twice.
-- Composable: no commit, the caller's transaction holds it all.
CREATE OR REPLACE FUNCTION queen.cursor_ack_checked(p_acks jsonb)
RETURNS TABLE (idx integer, transaction_id text, consumer_group text, status text,
               retry_count integer, applied boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    pair     record;
    outcomes queen.cursor_ack_outcome[] := '{}';
BEGIN
    FOR pair IN
        SELECT m.partition_id, coalesce(a ->> 'consumerGroup', '__queue__') AS grp,
               jsonb_agg(jsonb_build_object('idx', t.ord, 'txid', m.transaction_id, 'id', m.id,
                                            'wanted', a ->> 'status', 'error', a ->> 'error',
                                            'lease', a ->> 'leaseId')) AS items
        FROM jsonb_array_elements(p_acks) WITH ORDINALITY t(a, ord)
        CROSS JOIN LATERAL (SELECT m.partition_id, m.id, m.transaction_id
                            FROM queen.cursor_messages m
                            WHERE m.transaction_id = t.a ->> 'transactionId' LIMIT 1) m
        GROUP BY 1, 2 ORDER BY 1, 2
    LOOP
        outcomes := outcomes || queen.cursor_ack_consumer(pair.partition_id, pair.grp, pair.items);
    END LOOP;
    RETURN QUERY
    SELECT t.ord::integer, t.a ->> 'transactionId', coalesce(t.a ->> 'consumerGroup', '__queue__'),
           coalesce(o.status, 'not_found'), o.retry_count, coalesce(o.applied, false)
    FROM jsonb_array_elements(p_acks) WITH ORDINALITY t(a, ord)
    LEFT JOIN unnest(outcomes) o ON o.idx = t.ord
    ORDER BY t.ord;
END
$$;

-- queen.cursor_ack_checked without the applied flag (the ack routes).
CREATE OR REPLACE FUNCTION queen.cursor_ack(p_acks jsonb)
RETURNS TABLE (idx integer, transaction_id text, consumer_group text, status text,
               retry_count integer)
LANGUAGE sql AS $$
    SELECT c.idx, c.transaction_id, c.consumer_group, c.status, c.retry_count
    FROM queen.cursor_ack_checked(p_acks) c
$$;

-- queen.cursor_ack for the ack routes, whose caller wakes long polls itself once the
-- acks committed: the wake-up payloads (see queen.cursor_wake) come on the first row,
-- NULL when there are none.
CREATE OR REPLACE FUNCTION queen.cursor_ack_api(p_acks jsonb)
RETURNS TABLE (idx integer, transaction_id text, status text, retry_count integer,
               acknowledged_at timestamptz, wakes text[])
LANGUAGE plpgsql AS $$
DECLARE
    decided queen.cursor_ack_outcome[];
    woken   text[];
BEGIN
    PERFORM set_config('queen.wakes', '[]', true);
    decided := ARRAY(SELECT ROW(c.idx, c.transaction_id, c.consumer_group, NULL, c.status,
                                c.retry_count, NULL, c.applied)::queen.cursor_ack_outcome
                     FROM queen.cursor_ack_checked(p_acks) c);
    woken := ARRAY(SELECT jsonb_array_elements_text(current_setting('queen.wakes')::jsonb));
    PERFORM set_config('queen.wakes', '', true);
    RETURN QUERY
    SELECT d.idx, d.transaction_id, d.status, d.retry_count, now(),
           CASE WHEN d.idx = 1 AND cardinality(woken) > 0 THEN woken END
    FROM unnest(decided) d ORDER BY d.idx;
END
$$;
