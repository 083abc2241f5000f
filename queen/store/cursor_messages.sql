-- Statements of the API's hot path on the cursor store (queen.store.cursor_messages), by name.

-- cursor_api_push: store the items of a push body ({"items": [...]}), one row per item with its API id --
SELECT idx, message_id, transaction_id, status
FROM queen.cursor_push_api(%(body)s::jsonb -> 'items', %(producer)s)

-- cursor_api_pop: lease a partition for a group on any route and return its batch as queen.popped --
SELECT * FROM queen.cursor_pop_api(%(kind)s, %(queue)s, %(partition)s, %(namespace)s, %(task)s,
                                   %(group)s, %(batch)s, %(worker)s, %(mode)s, %(since)s,
                                   %(lease)s, %(prefer)s)

-- cursor_api_ack: acknowledge a batch, one row per acknowledgment in request order --
SELECT idx, transaction_id, status, retry_count, now() AS acknowledged_at
FROM queen.cursor_ack(%(acks)s::jsonb)

-- cursor_unclaim: give back a lease whose pop never reached its consumer (no attempt counted) --
SELECT queen.cursor_unclaim(%(lease)s)

-- cursor_give_back_claim: give back a pop whose answer was lost with its connection; NULL: not yet --
SELECT queen.cursor_give_back_claim(%(lease)s, %(backend)s)

-- cursor_api_extend: extend a live lease by seconds (NULL: its queue's leaseTime); no value when it has ended --
SELECT queen.cursor_extend(%(lease)s, coalesce(%(seconds)s::integer, (
    SELECT q.lease_time FROM queen.cursor_consumers c JOIN queen.queues q ON q.id = c.queue_id
    WHERE c.lease_id = %(lease)s)))

-- cursor_lease_queue: the queue a live lease is on --
SELECT queen.cursor_lease_queue(%(lease)s)

-- cursor_ready_partitions: wake payloads of partitions with work for the parked polls' routes --
SELECT payload FROM queen.cursor_ready_partitions(
    %(queues)s::text[], %(partition_queues)s::text[], %(partitions)s::text[],
    %(namespaces)s::text[], %(tasks)s::text[], %(limit)s) AS payload
