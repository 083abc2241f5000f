-- Wake-ups of long polls: the payload they listen for, the workers with polls parked,
-- the notifications of pushes that committed and of partitions with work, and the
-- fallback re-check of parked polls.

-- Wake long polls for work in these partitions: one notification per queue (payload
-- queen.wake_payload, naming its first partition), sent at commit; nothing while no
-- worker has a poll parked (queen.waiting_workers).
CREATE OR REPLACE FUNCTION queen.wake(p_partitions uuid[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(p_partitions) = 0
       OR NOT EXISTS (SELECT 1 FROM queen.waiting_workers w WHERE w.until > now()) THEN
        RETURN;
    END IF;
    PERFORM queen.send_wakes(ARRAY(
        SELECT queen.wake_payload(q.name, n.partition, q.namespace, q.task, NULL)
        FROM (SELECT p.queue_id, min(p.name) AS partition
              FROM queen.partitions p WHERE p.id = ANY (p_partitions) GROUP BY p.queue_id) n
        JOIN queen.queues q ON q.id = n.queue_id));
END
$$;

-- Wake long polls of one consumer group for work in a partition that group's lease no
-- longer holds (an ack ended it, or a pop's lease was given back): the payload names the
-- group after the route ('queue/partition/namespace/task/group'), and a worker wakes a
-- poll of that group only (other groups' leases did not change). Its callers check
-- queen.waiting_workers first (the ack's check also spares its probe for work left).
CREATE OR REPLACE FUNCTION queen.wake_group(p_partition uuid, p_group text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queen.send_wakes(ARRAY(
        SELECT queen.wake_payload(q.name, p.name, q.namespace, q.task, p_group)
        FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
        WHERE p.id = p_partition));
END
$$;

-- The wake-up (as queen.wake_group's) of a group's polls for its partition when a
-- message lies past p_after (where its cursor now stands, the lease ended): none while no
-- worker has a poll parked, and then no probe either. (Past the cursor, the first message
-- is one not done, if there is any. The probe walks the key in order: as an EXISTS, a
-- generic plan may scan the table from its start through every consumed message still
-- kept.) A set-returning SQL function, inlined where it is called in FROM, without a
-- call of its own. (The statements ending leases probe once, for the row's next message,
-- and wake by it: queen.kept_wakes.)
CREATE OR REPLACE FUNCTION queen.group_wakes(p_partition uuid, p_group text, p_after bigint)
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT queen.wake_payload(q.name, p.name, q.namespace, q.task, p_group)
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE p.id = p_partition
      AND EXISTS (SELECT 1 FROM queen.waiting_workers w WHERE w.until > now())
      AND (SELECT m.id FROM queen.messages m
           WHERE m.partition_id = p_partition AND m.id > p_after
           ORDER BY m.id LIMIT 1) IS NOT NULL
$$;

-- The wake-up of a group for its partition where the statement ending its lease kept the
-- first message past the new cursor (p_next, consumers.next_id: kept only while a worker
-- has a poll parked; NULL, none). Inlined in FROM, as queen.group_wakes: the lease-ending
-- statements (queen.end_done_leases, the server's ack_whole and ack_lease) make their
-- wake-ups by this rule.
CREATE OR REPLACE FUNCTION queen.kept_wakes(p_partition uuid, p_group text, p_next bigint)
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT queen.wake_payload(q.name, p.name, q.namespace, q.task, p_group)
    FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id
    WHERE p.id = p_partition AND p_next IS NOT NULL
$$;

-- Wake long polls of a group for its partition when a message lies past p_after
-- (queen.group_wakes).
CREATE OR REPLACE FUNCTION queen.wake_group_if_work(p_partition uuid, p_group text,
                                                    p_after bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queen.send_wakes(ARRAY(
        SELECT w FROM queen.group_wakes(p_partition, p_group, p_after) w));
END
$$;

-- (An earlier build sent those wake-ups by this one.)
DROP FUNCTION IF EXISTS queen.wake_groups_if_work(uuid[], text[], bigint[]);

-- Send wake-up payloads at commit. Inside queen.ack they are collected
-- instead (in the transaction's setting queen.wakes, a JSON array), for the caller to
-- send once the acks committed (queen.notify_wakes): a notification inside the ack would
-- make its commit wait for the cluster-wide NOTIFY lock, behind every other notifying
-- commit's WAL flush.
CREATE OR REPLACE FUNCTION queen.send_wakes(p_payloads text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    collected text := current_setting('queen.wakes', true);
BEGIN
    IF cardinality(p_payloads) = 0 THEN
        RETURN;
    END IF;
    IF left(collected, 1) = '[' THEN
        PERFORM set_config('queen.wakes', (collected::jsonb || to_jsonb(p_payloads))::text, true);
    ELSE
        PERFORM pg_notify(queen.wake_channel(), w) FROM unnest(p_payloads) w;
    END IF;
END
$$;

-- The long-poll fallback: wake payloads of partitions of the wanted
-- queues, queue/partition pairs and namespace/task filters (NULL matches anything) where
-- some group is free (no live lease, not held back) with a message past its cursor, or
-- where no group has a cursor yet and a message waits. A hint, like a notification:
-- the woken poll's group may find nothing. Walks every partition of the wanted queues.
CREATE OR REPLACE FUNCTION queen.ready_partitions(
    p_queues text[], p_partition_queues text[], p_partitions text[],
    p_namespaces text[], p_tasks text[], p_limit integer)
RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    WITH wanted AS (
        SELECT p.id, queen.wake_payload(q.name, p.name, q.namespace, q.task, NULL) AS payload
        FROM queen.queues q JOIN queen.partitions p ON p.queue_id = q.id
        WHERE q.name = ANY (p_queues)
           OR EXISTS (SELECT 1 FROM unnest(p_namespaces, p_tasks) f(ns, tk)
                      WHERE (f.ns IS NULL OR f.ns = q.namespace)
                        AND (f.tk IS NULL OR f.tk = q.task))
           OR EXISTS (SELECT 1 FROM unnest(p_partition_queues, p_partitions) n(queue, partition)
                      WHERE n.queue = q.name AND n.partition = p.name)
    )
    SELECT w.payload FROM wanted w
    WHERE EXISTS (SELECT 1 FROM queen.consumers c
                  WHERE c.partition_id = w.id
                    AND (c.lease_id IS NULL OR c.lease_expires_at <= now())
                    AND (c.not_before IS NULL OR c.not_before <= now())
                    -- in key order, as queen.settle's probe (an EXISTS may scan)
                    AND (SELECT m.id FROM queen.messages m
                         WHERE m.partition_id = w.id AND m.id > c.cursor_id
                           AND m.id <> ALL (c.done_ids)
                         ORDER BY m.id LIMIT 1) IS NOT NULL)
       OR (NOT EXISTS (SELECT 1 FROM queen.consumers c WHERE c.partition_id = w.id)
           AND EXISTS (SELECT 1 FROM queen.messages m WHERE m.partition_id = w.id))
    LIMIT p_limit
$$;

-- The wake-up protocol (queen/wakeup.py, pinned to these by tests): the channel long
-- polls listen on, and what they listen for: 'queue/partition/namespace/task', with
-- '/group' after it when the wake-up is for one consumer group only (p_group; NULL: for
-- every group). Names cannot contain '/'; a payload stays far below NOTIFY's 8000-byte
-- limit.
CREATE OR REPLACE FUNCTION queen.wake_channel() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'queen' $$;

CREATE OR REPLACE FUNCTION queen.wake_payload(p_queue text, p_partition text, p_namespace text,
                                              p_task text, p_group text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_queue || '/' || p_partition || '/' || coalesce(p_namespace, '') || '/'
           || coalesce(p_task, '') || coalesce('/' || p_group, '')
$$;

-- The partition of a push that names none.
CREATE OR REPLACE FUNCTION queen.default_partition() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'Default' $$;

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
-- behind another. Here the commit is asynchronous: a
-- notification needs no durability, and the lock is held for microseconds. Unknown
-- names are ignored.
CREATE OR REPLACE FUNCTION queen.notify_pushed(p_queues text[], p_partitions text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM queen.notify_sent(p_queues, p_partitions, '{}');
END
$$;

-- A sender's wake-ups of both kinds in one transaction: the pushes' (by queue and
-- partition name, as queen.notify_pushed) and those acks collected (payloads, as
-- queen.notify_wakes), sharing its notifications and its commit.
CREATE OR REPLACE FUNCTION queen.notify_sent(p_queues text[], p_partitions text[],
                                             p_wakes text[])
RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    PERFORM queen.notify_wakes(p_wakes || ARRAY(
        SELECT queen.wake_payload(q.name, p.name, q.namespace, q.task, NULL)
        FROM (SELECT DISTINCT * FROM unnest(p_queues, p_partitions)) n(queue, partition)
        JOIN queen.queues q ON q.name = n.queue
        JOIN queen.partitions p ON p.queue_id = q.id AND p.name = n.partition));
END
$$;

-- Send wake-ups (payloads of queen.wake_payload; those acks collected, or pushes') once
-- what they announce has committed, in a transaction of their own with an asynchronous
-- commit (see queen.notify_pushed); nothing while no worker has a poll parked. This and
-- queen.notify_pushed keep one plan per session (plan_cache_mode).
CREATE OR REPLACE FUNCTION queen.notify_wakes(p_payloads text[]) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM queen.waiting_workers w WHERE w.until > now()) THEN
        RETURN;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_notify(queen.wake_channel(), w) FROM (SELECT DISTINCT unnest(p_payloads) AS w) x;
END
$$;
