"""What tests ask of the database directly: SQL over the store's tables.

The tests that look at the tables themselves (e2e tests beside a real server included)
read them through these, so that each shape is written once.
"""

from __future__ import annotations

# Every message as the API shows it: transaction_id, queue, status, retry_count, worker,
# error (queue mode's, derived from its cursors, leases and failure records).
MESSAGE_VIEW = """
    SELECT x.transaction_id, x.queue,
           CASE WHEN f.status IN ('dead_letter', 'failed') THEN f.status
                WHEN x.leased THEN 'processing' WHEN x.done THEN 'completed'
                ELSE 'pending' END AS status,
           coalesce(f.retry_count, 0) AS retry_count,
           CASE WHEN x.leased THEN x.leased_by END AS worker,
           CASE WHEN f.status <> 'retry' THEN f.error END AS error
    FROM (SELECT m.partition_id, m.id, queen.txid(m.transaction_id, m.partition_id, m.id)
                   AS transaction_id, q.name AS queue, c.leased_by,
                 coalesce(m.id <= c.cursor_id OR m.id = ANY (c.done_ids), false) AS done,
                 coalesce(c.lease_id IS NOT NULL AND c.lease_expires_at > now()
                          AND m.id > c.cursor_id AND m.id <= c.lease_last_id
                          AND m.id <> ALL (c.done_ids || c.lease_acked), false) AS leased
          FROM queen.messages m
          JOIN queen.partitions p ON p.id = m.partition_id
          JOIN queen.queues q ON q.id = p.queue_id
          LEFT JOIN queen.consumers c
                 ON c.partition_id = m.partition_id AND c.consumer_group = '__queue__') x
    LEFT JOIN queen.failures f
           ON f.partition_id = x.partition_id AND f.message_id = x.id
          AND f.consumer_group = '__queue__'
    """

# A message's transactionId (m: a row of queen.messages), its client's or the one made.
TXID = "queen.txid(m.transaction_id, m.partition_id, m.id)"

# status -> count of every message.
STATUS_COUNTS = f"SELECT status, count(*) FROM ({MESSAGE_VIEW}) v GROUP BY 1"

# The workers that hold (or held) leases on the queue named by the one parameter.
LEASE_HOLDERS_OF_QUEUE = (
    "SELECT DISTINCT c.leased_by FROM queen.consumers c"
    " JOIN queen.queues q ON q.id = c.queue_id WHERE q.name = %s AND c.leased_by IS NOT NULL"
)

# Queue mode's lease of each partition of the queue named by the one parameter:
# (held, lease_size), one row per partition it has a cursor for.
PARTITION_LEASES = (
    "SELECT c.lease_id IS NOT NULL, c.lease_size FROM queen.consumers c"
    " JOIN queen.queues q ON q.id = c.queue_id"
    " WHERE q.name = %s AND c.consumer_group = '__queue__'"
)
# Who holds queue mode's lease of the partition named by the one parameter.
PARTITION_LEASED_BY = (
    "SELECT c.leased_by FROM queen.consumers c"
    " JOIN queen.partitions p ON p.id = c.partition_id"
    " WHERE p.name = %s AND c.consumer_group = '__queue__'"
)
# How many partitions hold a lease (live or expired, not yet ended).
LEASED_PARTITIONS = "SELECT count(*) FROM queen.consumers WHERE lease_id IS NOT NULL"
# Make every lease expired (as if its time had passed), without ending it.
EXPIRE_LEASES = (
    "UPDATE queen.consumers SET lease_expires_at = now() - interval '1 s'"
    " WHERE lease_id IS NOT NULL"
)

# How many partitions hold a message queue mode has not finished (pending or leased).
PARTITIONS_WITH_WORK = """
    SELECT count(*) FROM queen.partitions p
    LEFT JOIN queen.consumers c
           ON c.partition_id = p.id AND c.consumer_group = '__queue__'
    WHERE EXISTS (SELECT 1 FROM queen.messages m
                  WHERE m.partition_id = p.id AND m.id > coalesce(c.cursor_id, 0)
                    AND m.id <> ALL (coalesce(c.done_ids, '{}')))
    """

# Push a JSON array of items in SQL, as a client of the store would.
PUSH_ITEMS = "SELECT count(*) FROM queen.push_rows(%s::jsonb)"

# The table of the messages themselves.
MESSAGES = "queen.messages"

# (status, retry_count, worker) of every message of a queue (%s).
QUEUE_MESSAGES = f"SELECT status, retry_count, worker FROM ({MESSAGE_VIEW}) v WHERE queue = %s"

# The status of one message by transactionId (%s).
MESSAGE_STATUS = f"SELECT status FROM ({MESSAGE_VIEW}) v WHERE transaction_id = %s"
