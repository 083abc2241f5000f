-- Statements of queen.store.lifecycle (the store's functions on a caller's connection), by name.

-- push_rows: store a batch of items (a JSON array) for a producer --
SELECT idx, message_id, transaction_id, status FROM queen.push_rows(%(items)s::jsonb, %(producer)s)

-- push: the same, each message's id the API's (queen.message_uuid) --
SELECT idx, message_id, transaction_id, status
FROM queen.push(%(items)s::jsonb, %(producer)s)

-- pop_partition: lease one named partition for a group and read its batch --
SELECT * FROM queen.pop_partition(%(queue)s, %(partition)s, %(group)s, %(batch)s,
                                  %(worker)s, %(mode)s, %(since)s)

-- pop_queue: lease the free partition of a queue with the oldest next message --
SELECT * FROM queen.pop_queue(%(queue)s, %(group)s, %(batch)s, %(worker)s,
                              %(mode)s, %(since)s)

-- ack_rows: apply a batch of acknowledgments (a JSON array) --
SELECT idx, transaction_id, consumer_group, status, retry_count FROM queen.ack_rows(%(acks)s::jsonb)

-- extend_lease: extend a live lease; no row value when it is unknown or ended --
SELECT queen.extend_lease(%(lease)s, %(seconds)s)

-- expire_leases: end expired leases, up to a limit --
SELECT queen.expire_leases(%(limit)s)

-- consumer_groups: consumer groups of a queue (or every queue) with their backlog --
SELECT consumer_group, queue, subscription_mode, partitions, pending, lag_seconds
FROM queen.group_list(%(queue)s)

-- seek: move a group's cursors on a queue to the beginning, the end or a time --
SELECT queen.seek(%(queue)s, %(group)s, %(to)s, %(at)s)

-- delete_group: forget a group on a queue --
SELECT queen.group_delete(%(queue)s, %(group)s)

-- retention: delete retained messages past their queue's retention, up to a limit --
SELECT queen.retention(%(limit)s)

-- analyze_tables: analyze the store's tables that changed enough --
SELECT queen.analyze_tables(%(min_changes)s)

-- ack_checked: apply acknowledgments and say which ones changed something, and why not --
SELECT idx, transaction_id, consumer_group, status, retry_count, applied,
       queen.ack_reason(status, applied)
FROM queen.ack_checked(%(acks)s::jsonb)

-- ack_applied_before: whether a transaction's acks and pushes were applied by one before --
SELECT queen.ack_applied_before(%(txids)s::text[], %(groups)s::text[], %(pushed)s::text[])

-- group_summaries: groups of a queue (or every queue, or one group) with bounded backlogs --
SELECT consumer_group, queue, subscription_mode, subscription_from, joined_at, partitions,
       leased, pending, capped, lag_seconds
FROM queen.group_summaries(%(queue)s, %(group)s, %(cap)s, %(budget)s)

-- group_partitions: a group's cursor, bounded backlog and lease per partition --
SELECT consumer_group, queue, subscription_mode, subscription_from, joined_at, partition,
       cursor_id, pending, capped, lag_seconds, lease_id, leased_by, lease_expires_at,
       lease_size, updated_at
FROM queen.group_partitions(%(queue)s, %(group)s, %(cap)s, %(budget)s)

-- group_queues: the queues a group reads (has joined), by name --
SELECT q.name FROM queen.consumer_groups g JOIN queen.queues q ON q.id = g.queue_id
WHERE g.consumer_group = %(group)s ORDER BY q.name

-- locate: the queue of each message named by transactionId (unknown ones left out) --
SELECT u.txid AS transaction_id, q.name
FROM unnest(%(transaction_ids)s::text[]) u(txid)
CROSS JOIN LATERAL queen.named(u.txid) m
JOIN queen.partitions p ON p.id = m.partition_id
JOIN queen.queues q ON q.id = p.queue_id
