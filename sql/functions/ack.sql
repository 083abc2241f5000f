-- Acknowledgments: the request's items are read once, their messages looked up once, and
-- each (partition, group) is decided under its row lock, locked once per call.

-- (The items once reached a group as jsonb: a database of that build has this signature.)
-- Decide and apply the acknowledgments of one group's partition, given as parallel arrays
-- (the items' positions in the request, transactionIds, message ids, wanted statuses,
-- errors, leaseIds); the row is locked here. A message acked twice in one call is
-- decided once, by its last acknowledgment. A message deleted since the caller found it
-- (admin delete or clear, which wait for this row lock, or hold it) is left out, so its
-- item is not_found: counted as acked, it would end the lease before the rest of it was
-- acked, and the cursor would pass those.
CREATE OR REPLACE FUNCTION queen.ack_consumer(
    p_partition uuid, p_group text, p_idx integer[], p_txids text[], p_ids bigint[],
    p_wanted text[], p_errors text[], p_leases text[])
RETURNS queen.ack_outcome[]
LANGUAGE plpgsql AS $$
DECLARE
    r         record;
    c         queen.consumers;
    q         queen.queues;
    decided   queen.ack_outcome[];
    failed    bigint[];
    errors    text[];
    first_id  bigint;
    last_id   bigint;
    completed integer;
    done      bigint[];
    acked     bigint[];
    retried   bigint;
BEGIN
    SELECT x AS c, y AS q INTO r
    FROM queen.consumers x JOIN queen.queues y ON y.id = x.queue_id
    WHERE x.partition_id = p_partition AND x.consumer_group = p_group FOR UPDATE OF x;
    c := r.c;
    q := r.q;
    -- What each message's acknowledgment decides, and at once what is to be written.
    WITH i AS (
        SELECT DISTINCT ON (p_ids[k]) p_idx[k] AS idx, p_txids[k] AS txid, p_ids[k] AS id,
               p_wanted[k] AS wanted, p_errors[k] AS error, p_leases[k]::uuid AS lease,
               CASE WHEN p_ids[k] > c.retried_max THEN 0  -- (no retry record: no lookup)
                    ELSE queen.retries_of(p_partition, p_group, p_ids[k], c.retried_max)
               END AS tries
        -- (By subscript, not unnest: the planner sizes an unnest by the array it is given,
        -- and would plan the statement afresh for each call instead of reusing its plan.)
        FROM generate_subscripts(p_ids, 1) k
        -- One probe of the key per item (as an EXISTS, the planner may hash-join the
        -- items against every message of the partition, which grows with the backlog).
        CROSS JOIN LATERAL (SELECT 1 FROM queen.messages m
                            WHERE m.partition_id = p_partition AND m.id = p_ids[k] LIMIT 1) kept
        ORDER BY p_ids[k], p_idx[k] DESC
    ), d AS MATERIALIZED (  -- (each decision made once, however often it is named)
        SELECT i.idx, i.txid, i.id, i.error, v.status, v.applied,
               CASE WHEN v.status = 'retry_scheduled' AND v.applied THEN i.tries + 1
                    ELSE i.tries END AS tries
        FROM i CROSS JOIN LATERAL queen.ack_decide(c, q, i.id, i.wanted, i.lease, i.tries) v
    )
    SELECT array_agg(ROW(d.idx, d.txid, p_group, d.id, d.status, d.tries, d.error,
                         d.applied)::queen.ack_outcome),
           array_agg(d.id) FILTER (WHERE d.applied AND d.status <> 'completed'),
           array_agg(d.error) FILTER (WHERE d.applied AND d.status <> 'completed'),
           min(d.id) FILTER (WHERE d.applied AND d.status = 'completed'),
           max(d.id) FILTER (WHERE d.applied AND d.status = 'completed'),
           count(*) FILTER (WHERE d.applied AND d.status = 'completed'),
           coalesce(array_agg(d.id) FILTER (WHERE d.applied AND d.status <> 'retry_scheduled'),
                    '{}'),
           coalesce(array_agg(d.id) FILTER (WHERE d.applied), '{}'),
           max(d.id) FILTER (WHERE d.applied AND d.status = 'retry_scheduled')
    INTO decided, failed, errors, first_id, last_id, completed, done, acked, retried
    FROM d;

    IF failed IS NOT NULL THEN
        PERFORM queen.record_failures(p_partition, p_group, failed, errors, c.retried_max);
    END IF;
    IF completed > 0 THEN
        INSERT INTO queen.completions (partition_id, consumer_group, first_id, last_id, acked)
        VALUES (p_partition, p_group, first_id, last_id, completed);
    END IF;
    IF cardinality(acked) > 0 THEN
        PERFORM queen.settle_row(c, q.retry_delay, done, acked, retried);
    END IF;
    IF cardinality(decided) = cardinality(p_idx) THEN
        RETURN decided;
    END IF;
    -- A message acked more than once in the call: each of its items gets the outcome.
    RETURN ARRAY(SELECT ROW(x.idx, d.transaction_id, d.consumer_group, d.message_id, d.status,
                            d.retry_count, d.error, d.applied)::queen.ack_outcome
                 FROM unnest(p_idx, p_ids) x(idx, id)
                 JOIN unnest(decided) d ON d.message_id = x.id);
END
$$;
-- The common call, decided as a set: every item completes a message of the group's live
-- lease (p_lease, or whichever it is when NULL: the items name none) and together they
-- are all of its messages, none acked before in it (a consumer acking what it popped).
-- The row is locked first; then one statement (its snapshot taken after the lock, so it
-- sees what a delete that held the lock committed) matches the items' transactionIds
-- against the lease's messages, read once, and when every item matched records the
-- completion and ends the lease, the cursor past it (as queen.settle_row does for such
-- a lease); polls are woken when work is left. NULL when the call is anything else, or
-- when messages done out of order lie past the lease: queen.ack_consumer then decides
-- its items one by one.
CREATE OR REPLACE FUNCTION queen.ack_lease(p_partition uuid, p_group text, p_lease uuid,
                                           p_idx integer[], p_txids text[],
                                           p_errors text[])
RETURNS queen.ack_outcome[]
LANGUAGE plpgsql AS $$
DECLARE
    c       queen.consumers;
    decided queen.ack_outcome[];
BEGIN
    SELECT * INTO c FROM queen.consumers x
    WHERE x.partition_id = p_partition AND x.consumer_group = p_group
    FOR UPDATE;
    IF c.lease_id IS NULL OR c.lease_id IS DISTINCT FROM coalesce(p_lease, c.lease_id)
       OR cardinality(c.lease_acked) > 0 OR c.lease_size <> cardinality(p_txids)
       OR c.lease_last_id < ANY (c.done_ids) THEN
        RETURN NULL;
    END IF;
    WITH l AS MATERIALIZED (
        SELECT i.idx, i.txid, i.error, m.id
        FROM unnest(p_idx, p_txids, p_errors) i(idx, txid, error)
        JOIN (SELECT m.id, queen.txid(m.transaction_id, m.partition_id, m.id) AS txid
              FROM queen.messages m
              WHERE m.partition_id = p_partition AND m.id > c.cursor_id
                AND m.id <= c.lease_last_id AND m.id <> ALL (c.done_ids)) m
          ON m.txid = i.txid
    ), fit AS MATERIALIZED (  -- one row when every item matched a message of its own
        SELECT min(l.id) AS lo, max(l.id) AS hi, count(*)::integer AS n FROM l
        HAVING count(DISTINCT l.id) = cardinality(p_txids)
    ), completion AS (
        INSERT INTO queen.completions (partition_id, consumer_group, first_id, last_id, acked)
        SELECT p_partition, p_group, f.lo, f.hi, f.n FROM fit f
    ), ended AS (
        UPDATE queen.consumers x SET
            cursor_id = greatest(x.cursor_id, x.lease_last_id), done_ids = '{}',
            lease_acked = '{}', lease_id = NULL, leased_by = NULL, lease_expires_at = NULL,
            lease_last_id = NULL, lease_size = NULL, lease_digest = NULL, updated_at = now()
        FROM fit
        WHERE x.partition_id = p_partition AND x.consumer_group = p_group
    )
    SELECT array_agg(ROW(l.idx, l.txid, p_group, l.id, 'completed',
                         CASE WHEN l.id > c.retried_max THEN 0  -- (no retry record: no lookup)
                              ELSE queen.retries_of(p_partition, p_group, l.id,
                                                    c.retried_max) END,
                         l.error, true)::queen.ack_outcome)
    INTO decided
    FROM l CROSS JOIN fit;
    IF decided IS NOT NULL THEN
        PERFORM queen.wake_group_if_work(p_partition, p_group,
                                         greatest(c.cursor_id, c.lease_last_id));
    END IF;
    RETURN decided;
END
$$;

-- End the leases of the consumer rows p_locked (locked by the caller), every message of
-- each done and nothing done beyond it: the cursor moves past the lease, as
-- queen.settle_row does for such a lease. p_complete: the completions are written in the
-- same statement, one a lease, from its row (the lease holds every message past the
-- cursor up to its last: its first is the first past the cursor, a probe of the key; the
-- statement's parts share one snapshot, so they read the rows as they were). While a
-- worker has polls parked, each row keeps the first message past its new cursor (next_id,
-- a probe of the key). Returns, from the same statement, the wake-ups of the pairs with
-- such a message, for the caller to send (queen.kept_wakes; a message committed after
-- the statement's snapshot has its push's wake-up).
DROP FUNCTION IF EXISTS queen.end_done_leases(tid[]);  -- (an earlier build's: it sent them)
CREATE OR REPLACE FUNCTION queen.end_done_leases(p_locked tid[], p_complete boolean)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    woken text[];
BEGIN
    WITH done AS (
        INSERT INTO queen.completions (partition_id, consumer_group, first_id, last_id, acked)
        SELECT x.partition_id, x.consumer_group,
               (SELECT m.id FROM queen.messages m
                WHERE m.partition_id = x.partition_id AND m.id > x.cursor_id
                ORDER BY m.id LIMIT 1),
               x.lease_last_id, x.lease_size
        FROM queen.consumers x
        WHERE p_complete AND x.ctid = ANY (p_locked)
        ORDER BY 1, 2
    ), ended AS (
        UPDATE queen.consumers x SET
            cursor_id = greatest(x.cursor_id, x.lease_last_id), done_ids = '{}',
            lease_acked = '{}', lease_id = NULL, leased_by = NULL, lease_expires_at = NULL,
            lease_last_id = NULL, lease_size = NULL, lease_digest = NULL, updated_at = now(),
            next_after = CASE WHEN EXISTS (SELECT 1 FROM queen.waiting_workers w
                                             WHERE w.until > now())
                               THEN greatest(x.cursor_id, x.lease_last_id) END,
            next_id = CASE WHEN EXISTS (SELECT 1 FROM queen.waiting_workers w
                                          WHERE w.until > now())
                            THEN (SELECT m.id FROM queen.messages m
                                  WHERE m.partition_id = x.partition_id
                                    AND m.id > greatest(x.cursor_id, x.lease_last_id)
                                  ORDER BY m.id LIMIT 1) END
        WHERE x.ctid = ANY (p_locked)
        RETURNING x.partition_id, x.consumer_group, x.cursor_id, x.next_id
    )
    -- (The data-modifying parts run to completion whatever this part reads of them.)
    SELECT array_agg(w)
    INTO woken
    FROM ended e
    CROSS JOIN LATERAL queen.kept_wakes(e.partition_id, e.consumer_group, e.next_id) w;
    RETURN coalesce(woken, '{}');
END
$$;

-- (An earlier build's end_done_leases called this one.)
DROP FUNCTION IF EXISTS queen.wakes_if_work(uuid[], text[], bigint[]);

-- The fused call, decided as a set: items of several (partition, group) pairs (p_parts,
-- p_groups, with the message ids p_ids the caller looked up; NULL part: not found, left
-- out), every one completing a message, each pair's items all of its live lease's
-- messages, none acked before in it (many consumers, each acking what it popped). The
-- rows are locked in key order, checked, and written by one statement each (the
-- completions, the cursors and ended leases, the wake-ups), where deciding pair by pair
-- costs those statements per pair. NULL when any pair is anything else (a partial or
-- mixed lease, a lease named that is not the live one, messages done past the lease):
-- the caller then decides pair by pair.
CREATE OR REPLACE FUNCTION queen.ack_leases(p_parts uuid[], p_groups text[],
                                            p_idx integer[], p_txids text[], p_ids bigint[],
                                            p_errors text[], p_leases text[])
RETURNS queen.ack_outcome[]
LANGUAGE plpgsql AS $$
DECLARE
    decided queen.ack_outcome[];
    locked  tid[];
    pairs   integer;
    fitting integer;
BEGIN
    -- Lock the pairs' rows in key order, probing the key of each (a join could scan the
    -- whole table); their ctids name them below (locked, they stay where they are).
    locked := ARRAY(
        SELECT x.ctid
        FROM (SELECT DISTINCT u.part, u.grp FROM unnest(p_parts, p_groups) u(part, grp)
              WHERE u.part IS NOT NULL ORDER BY 1, 2) k
        CROSS JOIN LATERAL (SELECT x.ctid FROM queen.consumers x
                            WHERE x.partition_id = k.part AND x.consumer_group = k.grp
                            FOR UPDATE) x);
    WITH i AS (
        SELECT u.* FROM unnest(p_parts, p_groups, p_idx, p_txids, p_ids, p_errors, p_leases)
                        u(part, grp, idx, txid, id, error, lease)
        WHERE u.part IS NOT NULL
    ), k AS (
        SELECT i.part, i.grp, count(*) AS n, count(DISTINCT i.id) AS distinct_ids,
               min(i.id) AS lo, max(i.id) AS hi, array_agg(i.id) AS ids,
               count(i.lease) AS named, count(DISTINCT i.lease) AS leases,
               min(i.lease)::uuid AS lease
        FROM i GROUP BY i.part, i.grp
    ), c AS MATERIALIZED (
        SELECT x.* FROM queen.consumers x WHERE x.ctid = ANY (locked)
    ), fit AS MATERIALIZED (
        SELECT k.part, k.grp,
               coalesce(c.lease_id IS NOT NULL AND cardinality(c.lease_acked) = 0
                        AND c.lease_size = k.n AND k.distinct_ids = k.n
                        AND k.lo > c.cursor_id AND k.hi <= c.lease_last_id
                        AND NOT k.ids && c.done_ids
                        AND NOT EXISTS (SELECT 1 FROM unnest(c.done_ids) d
                                        WHERE d > c.lease_last_id)
                        AND (k.named = 0 OR (k.named = k.n AND k.leases = 1
                                             AND k.lease = c.lease_id)), false) AS fits,
               c.retried_max
        FROM k LEFT JOIN c ON c.partition_id = k.part AND c.consumer_group = k.grp
    )
    SELECT (SELECT count(*) FROM fit), (SELECT count(*) FROM fit WHERE fit.fits),
           (SELECT array_agg(ROW(i.idx, i.txid, i.grp, i.id, 'completed',
                                 CASE WHEN i.id > f.retried_max THEN 0  -- (no retry record)
                                      ELSE queen.retries_of(i.part, i.grp, i.id,
                                                            f.retried_max) END,
                                 i.error, true)::queen.ack_outcome)
            FROM i JOIN fit f ON f.part = i.part AND f.grp = i.grp)
    INTO pairs, fitting, decided;
    IF fitting < pairs OR pairs = 0 THEN
        RETURN NULL;
    END IF;
    INSERT INTO queen.completions (partition_id, consumer_group, first_id, last_id, acked)
    SELECT u.part, u.grp, min(u.id), max(u.id), count(*)
    FROM unnest(p_parts, p_groups, p_ids) u(part, grp, id)
    WHERE u.part IS NOT NULL
    GROUP BY u.part, u.grp
    ORDER BY u.part, u.grp;
    PERFORM queen.send_wakes(queen.end_done_leases(locked, false));
    RETURN decided;
END
$$;

-- The common call, decided without reading a message: each request of the call (p_sizes:
-- how many of the items are each one's, in order) completes every message of one live
-- lease of one group, naming them in the order the pop delivered them and nothing else:
-- its transactionIds' digest is the lease's (queen.lease_digest), its leaseIds, where
-- named, the lease's. Only leases that end cleanly qualify: nothing acked in them yet,
-- nothing done out of order past the cursor, no retry record past the cursor (so every
-- retry count is 0). The rows are locked in key order; when every request fits, the
-- completions are recorded and the leases ended (queen.end_done_leases), and the
-- wake-ups of the groups whose partitions have more work are returned, for the
-- caller to send (none: an empty array); otherwise nothing is
-- written, NULL is returned and the caller decides the items one way or another
-- (queen.ack_apply).
-- p_groups and p_leases name each item's, or with p_per_request each request's (one value
-- for all its items).
-- (An earlier build's had no p_per_request, and one before it returned whether the call
-- fitted: both are dropped.)
DROP FUNCTION IF EXISTS queen.ack_whole_leases(text[], text[], text[], integer[]);
CREATE OR REPLACE FUNCTION queen.ack_whole_leases(p_txids text[], p_groups text[],
                                                  p_leases text[], p_sizes integer[],
                                                  p_per_request boolean DEFAULT false)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    locked  tid[];
    fits    boolean;
BEGIN
    -- Each request's pair (its first transactionId names the partition: one probe of
    -- the key a request), leaseId and transactionIds joined; the rows locked in key
    -- order, each checked against its request. (A request mixing groups or leases is not
    -- one lease's. Slices and comparisons of the arrays: no pass per item in SQL.)
    WITH r AS MATERIALIZED (
        SELECT (SELECT n.partition_id FROM queen.named(p_txids[s.first]) n) AS part,
               coalesce(p_groups[s.one], '__queue__') AS grp,
               p_leases[s.one]::uuid AS lease, s.size, s.last,
               array_to_string(p_txids[s.first:s.last], E'\x1f') AS joined,
               p_per_request
               OR ((p_groups IS NULL OR p_groups[s.first:s.last]
                                        = array_fill(p_groups[s.first], ARRAY[s.size]))
                   AND (p_leases IS NULL OR p_leases[s.first:s.last]
                                            = array_fill(p_leases[s.first], ARRAY[s.size])))
                 AS uniform
        FROM (SELECT u.size, (sum(u.size) OVER w - u.size + 1)::integer AS first,
                     CASE WHEN p_per_request THEN u.k::integer
                          ELSE (sum(u.size) OVER w - u.size + 1)::integer END AS one,
                     (sum(u.size) OVER w)::integer AS last
              FROM unnest(p_sizes) WITH ORDINALITY u(size, k)
              WINDOW w AS (ORDER BY u.k)) s
    )
    -- (A row with no lease makes its pair's check NULL, not false, and bool_and passes
    -- over NULLs: coalesced, such a pair declines the call. The ack's transactionIds
    -- need no separator check: a lease has a digest only when its own joined text holds
    -- exactly size - 1 separators, so an ack's of as many items that reads alike holds
    -- none inside a transactionId either.)
    SELECT array_agg(x.ctid),
           count(*) = cardinality(p_sizes) AND count(DISTINCT x.ctid) = count(*)
           AND max(r.last) = cardinality(p_txids)
           AND bool_and(coalesce(
                   r.uniform AND x.lease_id = coalesce(r.lease, x.lease_id)
                   AND x.lease_size = r.size
                   AND x.lease_digest = hashtextextended(r.joined, 0)
                   AND cardinality(x.lease_acked) = 0 AND cardinality(x.done_ids) = 0
                   AND x.retried_max <= x.cursor_id, false))
    INTO locked, fits
    FROM (SELECT * FROM r ORDER BY r.part, r.grp) r
    CROSS JOIN LATERAL (SELECT x.ctid, x.lease_id, x.lease_size, x.lease_digest,
                               x.lease_acked, x.done_ids, x.retried_max, x.cursor_id
                        FROM queen.consumers x
                        WHERE x.partition_id = r.part AND x.consumer_group = r.grp
                        FOR UPDATE) x;
    IF NOT coalesce(fits, false) THEN
        RETURN NULL;
    END IF;
    RETURN queen.end_done_leases(locked, true);  -- (the completions with the end)
END
$$;

-- What an acknowledgment of message p_id does, given the group's row c and queue q:
-- already done -> its status (completed, or its failure for good: dead_letter / failed);
-- under the lease named (or the current one, when the item names none) -> completed, or
-- a failure: retry_scheduled, dead_letter or failed (retryLimit counts retries after the
-- first delivery); acked failed before in this lease -> retry_scheduled; else a refusal
-- (queen.ack_refusal). applied: it changed something, rather than reporting what was
-- already so; queen.ack_reason names why not.
CREATE OR REPLACE FUNCTION queen.ack_decide(c queen.consumers, q queen.queues,
                                            p_id bigint, p_wanted text, p_lease uuid,
                                            p_tries integer)
RETURNS TABLE (status text, applied boolean)
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_id <= c.cursor_id OR p_id = ANY (c.done_ids) THEN coalesce(
            (SELECT f.status FROM queen.failures f
             WHERE f.partition_id = c.partition_id AND f.consumer_group = c.consumer_group
               AND f.message_id = p_id AND f.status <> 'retry'), 'completed')
        WHEN c.lease_id IS NULL OR p_id > c.lease_last_id OR p_lease <> c.lease_id
            THEN queen.ack_refusal(c, p_id, p_wanted, p_lease)
        WHEN p_id = ANY (c.lease_acked) THEN 'retry_scheduled'
        WHEN p_wanted = 'completed' THEN 'completed'
        WHEN p_tries + 1 <= q.retry_limit THEN 'retry_scheduled'
        WHEN q.dlq_after_max_retries THEN 'dead_letter'
        ELSE 'failed' END,
    NOT coalesce(p_id <= c.cursor_id OR p_id = ANY (c.done_ids), false)
        AND c.lease_id IS NOT NULL AND p_id <= c.lease_last_id
        AND (p_lease IS NULL OR p_lease = c.lease_id)
        AND NOT p_id = ANY (c.lease_acked)
$$;

-- Why an acknowledgment of message p_id, not done for the group, cannot apply (only an
-- acknowledgment that does not apply gets here): a failed ack of a message waiting for
-- its redelivery after a failure, under no live lease -> retry_scheduled (the failure
-- is recorded already: an ack sent again after its answer was lost); a leaseId other
-- than the live lease that holds the message -> leased_by_other; no leaseId, or the
-- lease named does not hold the message -> not_leased; a leaseId that is no longer the
-- partition's lease -> lease_expired.
CREATE OR REPLACE FUNCTION queen.ack_refusal(c queen.consumers, p_id bigint, p_wanted text,
                                             p_lease uuid)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN c.partition_id IS NULL THEN 'not_leased'  -- (the group never read the partition)
        WHEN p_wanted = 'failed'
             AND NOT coalesce(p_id <= c.lease_last_id AND c.lease_expires_at > now(), false)
             AND EXISTS (SELECT 1 FROM queen.failures f
                         WHERE f.partition_id = c.partition_id
                           AND f.consumer_group = c.consumer_group
                           AND f.message_id = p_id AND f.status = 'retry')
            THEN 'retry_scheduled'
        WHEN p_id <= c.lease_last_id AND c.lease_expires_at > now() AND p_lease <> c.lease_id
            THEN 'leased_by_other'
        WHEN p_lease IS NULL OR p_lease = c.lease_id THEN 'not_leased'
        ELSE 'lease_expired' END
$$;

-- Why an acknowledgment changed nothing (NULL: it applied). A message done before gets
-- already_completed, or already_failed when its failure was recorded before (status
-- dead_letter, failed, or retry_scheduled); a refusal is its status (not_found,
-- not_leased, lease_expired, leased_by_other).
CREATE OR REPLACE FUNCTION queen.ack_reason(p_status text, p_applied boolean)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_applied THEN NULL
                ELSE CASE p_status WHEN 'completed' THEN 'already_completed'
                                   WHEN 'retry_scheduled' THEN 'already_failed'
                                   WHEN 'dead_letter' THEN 'already_failed'
                                   WHEN 'failed' THEN 'already_failed'
                                   ELSE p_status END END
$$;

-- When a message's acknowledgment by a group was recorded, for an acknowledgment that
-- found it done before (status: what it found): the completion that covers it, or its
-- failure; NULL when none tells (a seek moved the cursor over it), and for a refusal.
CREATE OR REPLACE FUNCTION queen.acknowledged_at(p_txid text, p_group text, p_status text)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE queen.ack_reason(p_status, false)
        WHEN 'already_completed' THEN
            (SELECT k.acked_at FROM queen.completions k
             WHERE k.partition_id = m.partition_id AND k.consumer_group = p_group
               AND k.last_id >= m.id AND k.first_id <= m.id
             ORDER BY k.last_id LIMIT 1)
        WHEN 'already_failed' THEN
            (SELECT f.failed_at FROM queen.failures f
             WHERE f.partition_id = m.partition_id AND f.consumer_group = p_group
               AND f.message_id = m.id)
        END
    FROM queen.named(p_txid) m
$$;

-- Whether a transaction's acknowledgments (messages p_txids, for groups p_groups: NULL
-- for queue mode) and pushes (p_pushed: the transactionIds it pushes) were all applied
-- before by one transaction: every message acked has a record (a completion that covers
-- it, or its failure) of one transaction time, the time each pushed message was stored
-- with (now() is its transaction's start, the same for all it writes). A transaction sent
-- again after its answer was lost is then answered so, instead of refused for its own
-- acknowledgments. Asked only of a transaction with an acknowledgment that did not apply.
CREATE OR REPLACE FUNCTION queen.ack_applied_before(p_txids text[], p_groups text[],
                                                    p_pushed text[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    WITH acked AS (
        SELECT u.k, m.partition_id, m.id, coalesce(u.grp, '__queue__') AS grp
        FROM unnest(p_txids, p_groups) WITH ORDINALITY u(txid, grp, k)
        CROSS JOIN LATERAL queen.named(u.txid) m
    ), recorded AS (
        SELECT a.k, r.at FROM acked a CROSS JOIN LATERAL (
            SELECT k.acked_at AS at
            FROM (SELECT k.acked_at, k.first_id FROM queen.completions k
                  WHERE k.partition_id = a.partition_id AND k.consumer_group = a.grp
                    AND k.last_id >= a.id
                  ORDER BY k.last_id LIMIT 64) k  -- (the calls of a retry's few seconds)
            WHERE k.first_id <= a.id
            UNION
            SELECT f.failed_at FROM queen.failures f
            WHERE f.partition_id = a.partition_id AND f.consumer_group = a.grp
              AND f.message_id = a.id) r
    ), pushed AS (
        SELECT m.created_at FROM unnest(p_pushed) p(txid)
        CROSS JOIN LATERAL queen.named(p.txid) n
        JOIN queen.messages m ON m.partition_id = n.partition_id AND m.id = n.id
    )
    SELECT (SELECT count(*) FROM acked) = cardinality(p_txids)
       AND (SELECT count(*) FROM pushed) = coalesce(cardinality(p_pushed), 0)
       AND EXISTS (SELECT 1 FROM recorded r GROUP BY r.at
                   HAVING count(DISTINCT r.k) = cardinality(p_txids)
                      AND NOT EXISTS (SELECT 1 FROM pushed p WHERE p.created_at <> r.at))
$$;

-- Acknowledge a batch: items {"transactionId", "status": "completed"|"failed", "error",
-- "consumerGroup" (default queue mode), "leaseId" (optional: without it, the current
-- lease of the message's partition and group)}. One outcome per item, in no particular
-- order (idx: its position, from 1): completed / retry_scheduled (with retryCount) /
-- dead_letter / failed, or a refusal (not_found, not_leased, lease_expired,
-- leased_by_other), and whether it changed something (applied) or only reported what
-- was already so (a message done before, or acked before in its lease). The items are
-- read once; the common call (one group's whole lease completed) is decided as a set
-- (queen.ack_lease); otherwise each message is looked up once, and when all are in one
-- partition for one group its outcomes are the group's own. Items of several partitions (a fused call of several consumers' acks)
-- are taken per partition and group, each decided as a set where it can be.
-- Composable: no commit, the caller's transaction holds it all. One plan per session for
-- each statement it runs (plan_cache_mode: see queen.push).
-- The items come as parallel arrays (transactionIds, consumerGroups, statuses, errors,
-- leaseIds: NULL where an item names none, or a NULL array where none does), as the ack
-- routes pass them: PostgreSQL reads arrays for a fraction of what the same items cost
-- out of JSON.
CREATE OR REPLACE FUNCTION queen.ack_apply(p_txids text[], p_groups text[],
                                           p_wanted text[], p_errors text[],
                                           p_leases text[])
RETURNS queen.ack_outcome[]
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    n        integer := coalesce(cardinality(p_txids), 0);
    idxs     integer[];
    groups   text[];
    parts    uuid[];
    ids      bigint[];
    errors   text[];
    leases   text[];
    pair     record;
    decided  queen.ack_outcome[];
    outcomes queen.ack_outcome[] := '{}';
BEGIN
    IF n = 0 THEN
        RETURN '{}';
    END IF;
    idxs := ARRAY(SELECT generate_series(1, n));
    -- (One group for every item, the common case, is the array itself; the others are
    -- read in one pass: a subscript walks a text array from its start.)
    groups := CASE WHEN p_groups IS NULL OR cardinality(array_remove(p_groups, NULL)) = 0
                   THEN array_fill('__queue__'::text, ARRAY[n])
                   WHEN p_groups[1] = ALL (p_groups) THEN p_groups
                   ELSE ARRAY(SELECT coalesce(u.g, '__queue__')
                              FROM unnest(p_groups) WITH ORDINALITY u(g, k) ORDER BY u.k) END;
    errors := coalesce(p_errors, array_fill(NULL::text, ARRAY[n]));
    leases := coalesce(p_leases, array_fill(NULL::text, ARRAY[n]));
    IF (leases[1] = ALL (leases) OR cardinality(array_remove(leases, NULL)) = 0)
       AND groups[1] = ALL (groups) AND 'completed' = ALL (p_wanted) THEN
        outcomes := queen.ack_lease(
            (SELECT n.partition_id FROM queen.named(p_txids[1]) n),
            groups[1], leases[1]::uuid, idxs, p_txids, errors);
        IF outcomes IS NOT NULL THEN
            RETURN outcomes;
        END IF;
        outcomes := '{}';
    END IF;
    SELECT array_agg(m.partition_id ORDER BY u.k), array_agg(m.id ORDER BY u.k)
    INTO parts, ids
    FROM unnest(p_txids) WITH ORDINALITY u(txid, k)
    LEFT JOIN LATERAL queen.named(u.txid) m ON true;
    IF array_position(parts, NULL) IS NULL AND parts[1] = ALL (parts)
       AND groups[1] = ALL (groups) THEN
        outcomes := queen.ack_consumer(parts[1], groups[1], idxs, p_txids, ids, p_wanted,
                                       errors, leases);
        IF cardinality(outcomes) = cardinality(idxs) THEN
            RETURN outcomes;
        END IF;
    ELSE
        IF 'completed' = ALL (p_wanted) THEN  -- (a fused call of whole leases: as a set)
            outcomes := coalesce(
                queen.ack_leases(parts, groups, idxs, p_txids, ids, errors, leases), '{}');
        END IF;
        -- Otherwise each (partition, group) once, in key order (concurrent calls lock
        -- rows alike).
        FOR pair IN
            SELECT u.part, u.grp, array_agg(u.idx) AS idxs, array_agg(u.txid) AS txids,
                   array_agg(u.id) AS ids, array_agg(u.wanted) AS wanted,
                   array_agg(u.error) AS errors, array_agg(u.lease) AS leases
            FROM unnest(parts, groups, idxs, p_txids, ids, p_wanted, errors, leases)
                 u(part, grp, idx, txid, id, wanted, error, lease)
            WHERE u.part IS NOT NULL AND cardinality(outcomes) = 0
            GROUP BY 1, 2 ORDER BY 1, 2
        LOOP
            decided := NULL;
            IF 'completed' = ALL (pair.wanted)
               AND (pair.leases[1] = ALL (pair.leases)
                    OR cardinality(array_remove(pair.leases, NULL)) = 0) THEN
                -- (A fused call's requests: each one lease's messages, as a lone one's.)
                decided := queen.ack_lease(pair.part, pair.grp, pair.leases[1]::uuid,
                                           pair.idxs, pair.txids, pair.errors);
            END IF;
            outcomes := outcomes || coalesce(decided, queen.ack_consumer(
                pair.part, pair.grp, pair.idxs, pair.txids, pair.ids, pair.wanted,
                pair.errors, pair.leases));
        END LOOP;
    END IF;
    RETURN ARRAY(SELECT ROW(u.idx, u.txid, u.grp, o.message_id, coalesce(o.status, 'not_found'),
                            o.retry_count, o.error, coalesce(o.applied, false)
                           )::queen.ack_outcome
                 FROM unnest(idxs, p_txids, groups) u(idx, txid, grp)
                 LEFT JOIN unnest(outcomes) o ON o.idx = u.idx);
END
$$;

-- A JSON array of acknowledgments as the parallel arrays queen.ack_apply takes.
CREATE OR REPLACE FUNCTION queen.ack_columns(p_acks jsonb,
    OUT txids text[], OUT groups text[], OUT wanted text[], OUT errors text[],
    OUT leases text[])
LANGUAGE sql IMMUTABLE AS $$
    SELECT array_agg(t.a ->> 'transactionId' ORDER BY t.ord),
           array_agg(t.a ->> 'consumerGroup' ORDER BY t.ord),
           array_agg(t.a ->> 'status' ORDER BY t.ord), array_agg(t.a ->> 'error' ORDER BY t.ord),
           array_agg(t.a ->> 'leaseId' ORDER BY t.ord)
    FROM jsonb_array_elements(p_acks) WITH ORDINALITY t(a, ord)
$$;

-- (An earlier build's queen.ack_checked called this one.)
DROP FUNCTION IF EXISTS queen.ack_apply_json(jsonb);

-- queen.ack_apply of a JSON array of the items, as rows in item order. The transaction
-- endpoint refuses an item not applied, since the work it commits with the ack would
-- then be done twice. Items that complete one whole lease, as popped, are decided by its
-- digest first (queen.ack_whole_leases: no message read), as the ack routes' are. One
-- plan per session (plan_cache_mode), as queen.ack_items.
CREATE OR REPLACE FUNCTION queen.ack_checked(p_acks jsonb)
RETURNS TABLE (idx integer, transaction_id text, consumer_group text, status text,
               retry_count integer, applied boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    i     record;
    woken text[];
BEGIN
    SELECT * INTO i FROM queen.ack_columns(p_acks);
    IF cardinality(i.txids) > 0 AND 'completed' = ALL (i.wanted) THEN
        woken := queen.ack_whole_leases(i.txids, i.groups, i.leases,
                                        ARRAY[cardinality(i.txids)]);
    END IF;
    IF woken IS NOT NULL THEN
        PERFORM queen.send_wakes(woken);
        RETURN QUERY
        SELECT t.k::integer, t.txid, coalesce(i.groups[t.k], '__queue__'), 'completed'::text,
               0, true
        FROM unnest(i.txids) WITH ORDINALITY t(txid, k) ORDER BY t.k;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT o.idx, o.transaction_id, o.consumer_group, o.status, o.retry_count, o.applied
    FROM unnest(queen.ack_apply(i.txids, i.groups, i.wanted, i.errors, i.leases)) o
    ORDER BY o.idx;
END
$$;

-- queen.ack_checked without the applied flag (the ack routes).
CREATE OR REPLACE FUNCTION queen.ack_rows(p_acks jsonb)
RETURNS TABLE (idx integer, transaction_id text, consumer_group text, status text,
               retry_count integer)
LANGUAGE sql AS $$
    SELECT c.idx, c.transaction_id, c.consumer_group, c.status, c.retry_count
    FROM queen.ack_checked(p_acks) c
$$;

-- Each request's value (p_values, one a request) once for each of its items (p_sizes:
-- how many are each request's); NULL stays NULL.
CREATE OR REPLACE FUNCTION queen.each_item(p_values text[], p_sizes integer[])
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$  -- (SQL would need a subquery: never inlined)
BEGIN
    IF p_values IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY(SELECT u.value FROM unnest(p_values, p_sizes) WITH ORDINALITY u(value, size, k)
                 CROSS JOIN generate_series(1, u.size) ORDER BY u.k);
END
$$;

-- queen.ack_rows for the ack routes, whose caller wakes long polls itself once the
-- acks committed: the wake-up payloads (see queen.wake) come on the first row,
-- NULL when there are none. acknowledged_at: now for an acknowledgment that applied;
-- for one that found its message done before, when that was recorded (when known);
-- reason: why nothing changed (queen.ack_reason), looked up only for those. p_sizes:
-- how many of the items are each request's, in order, when the call fuses several
-- (NULL: not known). p_compact: a call decided as whole leases (every item completed)
-- answers one row instead of one an item, idx 0 and no transactionId, from which the
-- caller, which knows the items, makes each one's. p_per_request: p_groups, p_wanted,
-- p_errors and p_leases hold one value a request, for all its items, not one an item
-- (the common call's: 100 items acked as popped send one status and one leaseId, not
-- 100 of each to parse). One plan per session (plan_cache_mode).
-- (An earlier build's returned no reason: a changed result type cannot be replaced, so
-- that one is dropped, once; the current one is replaced in place as any other.)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure(
                         'queen.ack_items(text[], text[], text[], text[], text[])')
                 AND NOT 'reason' = ANY (p.proargnames)) THEN
        DROP FUNCTION IF EXISTS queen.ack(jsonb);
        DROP FUNCTION queen.ack_items(text[], text[], text[], text[], text[]);
    END IF;
END
$$;
DROP FUNCTION IF EXISTS queen.ack_items(text[], text[], text[], text[], text[],
                                        integer[]);  -- (an earlier build's: no p_compact)
DROP FUNCTION IF EXISTS queen.ack_items(text[], text[], text[], text[], text[], integer[],
                                        boolean);  -- (an earlier build's: no p_per_request)
CREATE OR REPLACE FUNCTION queen.ack_items(p_txids text[], p_groups text[], p_wanted text[],
                                p_errors text[], p_leases text[], p_sizes integer[],
                                p_compact boolean DEFAULT false,
                                p_per_request boolean DEFAULT false)
RETURNS TABLE (idx integer, transaction_id text, status text, retry_count integer,
               acknowledged_at timestamptz, reason text, wakes text[])
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    decided queen.ack_outcome[];
    woken   text[];
    ignored text;
    whole   boolean := false;
BEGIN
    -- The acks' commit does not wait for the disk: an ack a crash forgets leaves its
    -- message leased until the lease expires, then delivered again (at-least-once).
    ignored := set_config('synchronous_commit', 'off', true);
    -- Requests each completing one whole lease, as popped: decided without reading a
    -- message, every outcome alike, the wake-ups returned (queen.ack_whole_leases).
    IF 0 < ALL (p_sizes) AND cardinality(p_sizes) > 0 AND 'completed' = ALL (p_wanted) THEN
        woken := queen.ack_whole_leases(p_txids, p_groups, p_leases, p_sizes, p_per_request);
        whole := woken IS NOT NULL;
    END IF;
    IF NOT whole AND p_per_request THEN  -- each request's values, for each of its items
        p_groups := queen.each_item(p_groups, p_sizes);
        p_wanted := queen.each_item(p_wanted, p_sizes);
        p_errors := queen.each_item(p_errors, p_sizes);
        p_leases := queen.each_item(p_leases, p_sizes);
    END IF;
    IF NOT whole THEN  -- (its wake-ups collected in the setting queen.wakes)
        ignored := set_config('queen.wakes', '[]', true);
        decided := queen.ack_apply(p_txids, p_groups, p_wanted, p_errors, p_leases);
        IF current_setting('queen.wakes') <> '[]' THEN
            woken := ARRAY(SELECT jsonb_array_elements_text(
                               current_setting('queen.wakes')::jsonb));
        END IF;
        ignored := set_config('queen.wakes', '', true);
    END IF;
    IF whole AND p_compact THEN
        RETURN QUERY SELECT 0, NULL::text, 'completed'::text, 0, now(), NULL::text,
                            CASE WHEN cardinality(woken) > 0 THEN woken END;
        RETURN;
    END IF;
    IF whole THEN
        RETURN QUERY
        SELECT t.k::integer, t.txid, 'completed'::text, 0, now(), NULL::text,
               CASE WHEN t.k = 1 AND cardinality(woken) > 0 THEN woken END
        FROM unnest(p_txids) WITH ORDINALITY t(txid, k) ORDER BY t.k;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT d.idx, d.transaction_id, d.status, d.retry_count,
           CASE WHEN d.applied THEN now()
                ELSE queen.acknowledged_at(d.transaction_id, d.consumer_group, d.status) END,
           CASE WHEN NOT d.applied THEN queen.ack_reason(d.status, d.applied) END,
           CASE WHEN d.idx = 1 AND cardinality(woken) > 0 THEN woken END
    FROM unnest(decided) d ORDER BY d.idx;
END
$$;

-- queen.ack_items of one request's items (the call of an earlier build, which named no
-- requests).
CREATE OR REPLACE FUNCTION queen.ack_items(p_txids text[], p_groups text[], p_wanted text[],
                                p_errors text[], p_leases text[])
RETURNS TABLE (idx integer, transaction_id text, status text, retry_count integer,
               acknowledged_at timestamptz, reason text, wakes text[])
LANGUAGE plpgsql AS $$  -- (a SQL function's statement would be planned at each call)
BEGIN
    RETURN QUERY SELECT * FROM queen.ack_items(p_txids, p_groups, p_wanted, p_errors,
                                               p_leases, ARRAY[cardinality(p_txids)]);
END
$$;

-- queen.ack_items of a JSON array of the items.
CREATE OR REPLACE FUNCTION queen.ack(p_acks jsonb)
RETURNS TABLE (idx integer, transaction_id text, status text, retry_count integer,
               acknowledged_at timestamptz, reason text, wakes text[])
LANGUAGE sql AS $$
    SELECT a.* FROM queen.ack_columns(p_acks) i
    CROSS JOIN LATERAL queen.ack_items(i.txids, i.groups, i.wanted, i.errors,
                                       i.leases) a
$$;
