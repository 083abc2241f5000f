-- Wake-ups of long polls: the payload they listen for, the workers with polls parked,
-- and the notifications of pushes that committed.

-- What a long poll listens for: 'queue/partition/namespace/task' (names cannot contain
-- '/'; at most ~520 bytes, far below NOTIFY's 8000-byte limit).
CREATE OR REPLACE FUNCTION queen.wake_payload(p_queue text, p_partition text, p_namespace text, p_task text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_queue || '/' || p_partition || '/' || coalesce(p_namespace, '') || '/' || coalesce(p_task, '')
$$;

-- List a worker as having polls parked for the next p_seconds (see queen.waiting_workers).
CREATE OR REPLACE FUNCTION queen.list_waiting_worker(p_worker text, p_seconds integer) RETURNS void
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
CREATE OR REPLACE FUNCTION queen.notify_pushed(p_queues text[], p_partitions text[]) RETURNS void
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
