-- 0007: consumers renew a lease while they work (POST /api/v1/lease/:leaseId/extend).

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
