-- ANALYZE of queen.messages samples 300 rows per unit of the largest statistics target
-- of its columns: at the default target of 100, 30,000 rows each time, which maintenance
-- (queen.analyze_tables) and autovacuum repeat as the table grows and turns over. The
-- columns queries select by (id, partition_id, created_at) need little: ids and times
-- grow with each push, so a few histogram buckets place a range, and partitions are
-- looked up by key. A target of 10 samples 3,000 rows, a fifth of the time or less.
ALTER TABLE queen.messages
    ALTER COLUMN id SET STATISTICS 10,
    ALTER COLUMN partition_id SET STATISTICS 10,
    ALTER COLUMN created_at SET STATISTICS 10;
