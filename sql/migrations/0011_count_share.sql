-- The share of the ids drawn that went to a partition, as its last count refresh found
-- it (messages arrived over the ids they span; NULL: not known yet). Maintenance
-- estimates from it how many messages a partition got since (queen.count_refresh)
-- instead of walking them.
ALTER TABLE queen.partition_counts ADD COLUMN share real;
