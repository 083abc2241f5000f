-- ANALYZE of queen.messages gathers statistics only for the columns queries select by:
-- id, partition_id and created_at. No statement filters, sorts or groups by a payload,
-- trace id, producer or encrypted flag, and a transactionId is looked up through its
-- unique index, whose uniqueness the planner knows without statistics. Sorting a sample
-- of payloads (jsonb) and transactionIds was about half of the table's ANALYZE, which
-- maintenance runs as the table grows (queen.analyze_tables) and autovacuum as it
-- changes.
ALTER TABLE queen.messages
    ALTER COLUMN payload SET STATISTICS 0,
    ALTER COLUMN transaction_id SET STATISTICS 0,
    ALTER COLUMN trace_id SET STATISTICS 0,
    ALTER COLUMN producer SET STATISTICS 0,
    ALTER COLUMN encrypted SET STATISTICS 0;
