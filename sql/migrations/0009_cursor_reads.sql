-- 0009: what the read and admin endpoints need from the cursor store (0006): counts of
-- queue mode per partition and activity per minute, kept by maintenance
-- (queen.cursor_count_refresh) so that no request counts the message table. The
-- functions are in sql/functions/cursor_reads.sql and cursor_admin.sql.

-- Queue mode's counts of one partition up to two watermarks: `total` messages with
-- id <= counted_id, `below` of them with id <= cursor_counted (where queue mode's cursor
-- stood when last counted), and the final failure records (failed, dead_letter) of those.
-- A read adds what lies past the watermarks (bounded walks of the primary keys); the
-- delete trigger takes deleted messages out.
CREATE TABLE queen.cursor_counts (
    partition_id   uuid PRIMARY KEY REFERENCES queen.partitions (id) ON DELETE CASCADE,
    counted_id     bigint NOT NULL DEFAULT 0,
    total          bigint NOT NULL DEFAULT 0,
    cursor_counted bigint NOT NULL DEFAULT 0,
    below          bigint NOT NULL DEFAULT 0,
    failed         bigint NOT NULL DEFAULT 0,
    dead_letter    bigint NOT NULL DEFAULT 0,
    refreshed_at   timestamptz NOT NULL DEFAULT '-infinity'
);

-- Activity of queue mode per minute and partition, as maintenance counts it: messages
-- created (by created_at), completed (by the time of their ack, with the sum and a
-- histogram of created -> acked in ms: bucket b holds [2^(b/2), 2^((b+1)/2)) ms),
-- failed and dead-lettered for good (by failed_at).
CREATE TABLE queen.cursor_metrics_minute (
    minute       timestamptz NOT NULL,
    partition_id uuid NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    incoming     bigint NOT NULL DEFAULT 0,
    completed    bigint NOT NULL DEFAULT 0,
    failed       bigint NOT NULL DEFAULT 0,
    dead_letter  bigint NOT NULL DEFAULT 0,
    lag_ms       bigint NOT NULL DEFAULT 0,
    lag_hist     integer[] NOT NULL DEFAULT array_fill(0, ARRAY[64]),
    PRIMARY KEY (minute, partition_id)
);

-- Deleted messages (retention, admin delete, clear) leave the counts and take their
-- failure records along. A statement trigger: pushes do not fire it. Its body is
-- replaced by sql/functions/cursor_reads.sql on every migrate.
CREATE FUNCTION queen.cursor_messages_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER cursor_messages_deleted AFTER DELETE ON queen.cursor_messages
REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
EXECUTE FUNCTION queen.cursor_messages_deleted();
