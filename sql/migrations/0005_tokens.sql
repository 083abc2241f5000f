-- 0005: API tokens (QUEEN_AUTH=on) and the producer of each message.

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

-- push stores the producer: a second argument (the signature changes, so drop and create).
DROP FUNCTION queen.push(jsonb);

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

ALTER FUNCTION queen.push(jsonb, text) SET plan_cache_mode = force_generic_plan;
