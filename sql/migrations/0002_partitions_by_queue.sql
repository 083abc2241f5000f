-- 0002: a queue's partitions in id order, so that a pop by queue reads them from a
-- random point on and stops at the first ones with work (queen.cursor_candidates)
-- instead of probing every partition of the queue.

CREATE INDEX partitions_queue_id ON queen.partitions (queue_id, id);
