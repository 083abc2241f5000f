-- Statements of the cursor store (queen.store.cursors), by name.

-- cursor_push: store a batch of items (a JSON array) for a producer --
SELECT idx, message_id, transaction_id, status FROM queen.cursor_push(%(items)s::jsonb, %(producer)s)

-- cursor_pop_partition: lease one named partition for a group and read its batch --
SELECT * FROM queen.cursor_pop_partition(%(queue)s, %(partition)s, %(group)s, %(batch)s,
                                         %(worker)s, %(mode)s, %(since)s)

-- cursor_pop_queue: lease the free partition of a queue with the oldest next message --
SELECT * FROM queen.cursor_pop_queue(%(queue)s, %(group)s, %(batch)s, %(worker)s,
                                     %(mode)s, %(since)s)

-- cursor_ack: apply a batch of acknowledgments (a JSON array) --
SELECT idx, transaction_id, consumer_group, status, retry_count FROM queen.cursor_ack(%(acks)s::jsonb)

-- cursor_extend: extend a live lease; no row value when it is unknown or ended --
SELECT queen.cursor_extend(%(lease)s, %(seconds)s)

-- cursor_expire_leases: end expired leases, up to a limit --
SELECT queen.cursor_expire_leases(%(limit)s)

-- cursor_groups: consumer groups of a queue (or every queue) with their backlog --
SELECT consumer_group, queue, subscription_mode, partitions, pending, lag_seconds
FROM queen.cursor_group_list(%(queue)s)

-- cursor_seek: move a group's cursors on a queue to the beginning, the end or a time --
SELECT queen.cursor_seek(%(queue)s, %(group)s, %(to)s, %(at)s)

-- cursor_delete_group: forget a group on a queue --
SELECT queen.cursor_group_delete(%(queue)s, %(group)s)

-- cursor_retention: delete retained messages past their queue's retention, up to a limit --
SELECT queen.cursor_retention(%(limit)s)

-- cursor_analyze: analyze the cursor tables that changed enough --
SELECT queen.cursor_analyze(%(min_changes)s)
