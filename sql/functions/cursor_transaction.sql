-- The transaction endpoint's part of the cursor store (POST /api/v1/transaction): its
-- pushes are queen.cursor_push; its acknowledgments need to know which ones applied.

-- Acknowledge as queen.cursor_ack does, and say of each item whether it changed
-- something (applied) or only reported what was already so (a message done before, or
-- acked before in its lease): a transaction refuses the latter, since the work it commits
-- with the ack would then be done twice. Composable: the caller's transaction holds it.
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
