-- The first message past a group's cursor in a partition, as the whole-lease ack that
-- moved the cursor there found it while polls were parked (next_id; NULL: none had
-- arrived, or none was looked for), and the cursor it was found for (next_after). Ids
-- are drawn in commit order within a partition, so it stays true while the cursor is
-- there: a ranking of a queue's partitions reads it instead of probing the partition's
-- key (queen.rank_partitions). Any other move of the cursor leaves it unused (next_after
-- differs); a delete of the message it names clears it (queen.messages_deleted), or else
-- the pop that finds the partition empty (queen.pop).
ALTER TABLE queen.consumers ADD COLUMN next_id bigint, ADD COLUMN next_after bigint;
