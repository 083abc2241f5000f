-- 0001: the schema. Tables, indexes, types and the one trigger of Queen's store; the
-- functions are in sql/functions/ (installed with CREATE OR REPLACE on every migrate).
-- docs/SCHEMA.md lists every table and what a row of it is.

CREATE SCHEMA IF NOT EXISTS queen;

-- Queues carry every option as a column: the hot paths read them in SQL.
CREATE TABLE queen.queues (
    id                          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name                        text NOT NULL UNIQUE,
    namespace                   text,
    task                        text,
    priority                    integer NOT NULL DEFAULT 0,
    lease_time                  integer NOT NULL DEFAULT 300,     -- seconds
    retry_limit                 integer NOT NULL DEFAULT 3,
    max_size                    integer NOT NULL DEFAULT 0,       -- pending messages, 0 = unlimited
    ttl                         integer NOT NULL DEFAULT 0,       -- seconds, 0 = forever
    dlq_after_max_retries       boolean NOT NULL DEFAULT true,
    delayed_processing          integer NOT NULL DEFAULT 0,       -- seconds
    window_buffer               integer NOT NULL DEFAULT 0,       -- seconds
    retention_seconds           integer NOT NULL DEFAULT 0,
    completed_retention_seconds integer NOT NULL DEFAULT 0,
    retention_enabled           boolean NOT NULL DEFAULT false,
    encryption_enabled          boolean NOT NULL DEFAULT false,
    max_wait_time_seconds       integer NOT NULL DEFAULT 0,       -- 0 = no cap
    -- How long a failed message waits before its redelivery (ms); its partition waits
    -- with it (FIFO).
    retry_delay                 integer NOT NULL DEFAULT 0,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX queues_namespace ON queen.queues (namespace) WHERE namespace IS NOT NULL;
CREATE INDEX queues_task ON queen.queues (task) WHERE task IS NOT NULL;

-- A partition is a FIFO lane of a queue, and what a consumer group leases (per group:
-- queen.consumers). Made by the first push into it; removed by maintenance when
-- it holds no message and no live lease.
CREATE TABLE queen.partitions (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    queue_id    uuid NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
);
-- A queue's partitions in id order, so that a pop by queue reads them from a random
-- point on and stops at the first ones with work (queen.candidates) instead of probing
-- every partition of the queue.
CREATE INDEX partitions_queue_id ON queen.partitions (queue_id, id);

-- Immutable messages. Ids come from one identity, drawn by a push while it holds its
-- partitions' push locks (queen.push_lock_key) until it commits: within a
-- partition, ids are in commit order, so a reader that sees a message has seen every
-- message of the partition with a lower id, and a cursor never passes one that commits
-- later.
CREATE TABLE queen.messages (
    id             bigint GENERATED ALWAYS AS IDENTITY,
    -- No foreign key: a per-row check is a large share of a batch insert. A push holds the
    -- push locks of the partitions it writes to instead, once per call, and their removal
    -- takes the same locks (queen.push_targets, queen.cleanup_partitions).
    partition_id   uuid NOT NULL,
    transaction_id text COLLATE "C" NOT NULL,     -- unique system-wide
    payload        jsonb NOT NULL,
    encrypted      boolean NOT NULL DEFAULT false, -- payload is {"iv","tag","data"}
    producer       text,                          -- the pushing token's name
    trace_id       text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, id),
    UNIQUE (transaction_id)
) WITH (
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- Consumer group metadata per queue: where a group's cursors start in a partition (at
-- the group's first pop of the queue; later modes are ignored). Queue mode is the group
-- '__queue__'.
CREATE TABLE queen.consumer_groups (
    queue_id          uuid NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    consumer_group    text COLLATE "C" NOT NULL,
    subscription_mode text NOT NULL CHECK (subscription_mode IN ('all', 'new', 'from')),
    subscription_from timestamptz,                -- 'new': created_at; 'from': the time asked
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, consumer_group)
);

-- One row per (partition, group): every message of the partition with id <= cursor_id is
-- done for the group (completed, dead-lettered or failed for good), and so are the ids in
-- done_ids (acked out of order, past a message that is to be retried). While lease_id is
-- set, the messages past the cursor up to lease_last_id (not in done_ids) are leased to
-- leased_by until lease_expires_at; lease_acked lists those acked so far. retried_max is
-- the highest id with a retry record (queen.failures) past the cursor: a pop looks
-- retry counts up only below it. not_before holds the partition back (retryDelay).
CREATE TABLE queen.consumers (
    partition_id     uuid NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    consumer_group   text COLLATE "C" NOT NULL,
    queue_id         uuid NOT NULL,
    cursor_id        bigint NOT NULL DEFAULT 0,
    done_ids         bigint[] NOT NULL DEFAULT '{}',
    retried_max      bigint NOT NULL DEFAULT 0,
    not_before       timestamptz,
    lease_id         uuid,
    leased_by        text,
    lease_expires_at timestamptz,
    lease_last_id    bigint,
    lease_size       integer,
    lease_acked      bigint[] NOT NULL DEFAULT '{}',
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group)
) WITH (fillfactor = 50);
CREATE INDEX consumers_group ON queen.consumers (queue_id, consumer_group);
-- No index covers a lease column: a pop and the ack that ends its lease then change no
-- indexed value, and PostgreSQL updates the row in place (HOT), with no index entry.
-- Lease extension and expiry read the table (one row per partition and group) instead.

-- A message's failures for one group, one row updated in place: status 'retry' while it
-- waits for redelivery with retry_count retries, 'dead_letter' or 'failed' for good.
CREATE TABLE queen.failures (
    partition_id   uuid NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    message_id     bigint NOT NULL,
    status         text NOT NULL CHECK (status IN ('retry', 'dead_letter', 'failed')),
    retry_count    integer NOT NULL,
    error          text,
    failed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group, message_id)
);
CREATE INDEX failures_final ON queen.failures (failed_at) WHERE status <> 'retry';

-- Completions: one row per ack call and (partition, group), covering the ids it
-- completed (first_id..last_id, count of them); never one row per message.
CREATE TABLE queen.completions (
    partition_id   uuid NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    first_id       bigint NOT NULL,
    last_id        bigint NOT NULL,
    acked          integer NOT NULL,
    acked_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX completions_range
    ON queen.completions (partition_id, consumer_group, last_id);

-- Queue mode's counts of one partition up to two watermarks: `total` messages with
-- id <= counted_id, `below` of them with id <= cursor_counted (where queue mode's cursor
-- stood when last counted), and the final failure records (failed, dead_letter) of those.
-- Kept by maintenance (queen.count_refresh), so that no request counts the
-- message table: a read adds what lies past the watermarks (bounded walks of the primary
-- keys); the delete trigger below takes deleted messages out.
CREATE TABLE queen.partition_counts (
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
CREATE TABLE queen.metrics_minute (
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

-- Workers with long polls parked, each listed until a moment it keeps pushing forward
-- while polls wait there. Pushes skip their wake-ups while nobody is listed: no poll can
-- be parked unseen, because a worker lists itself (and commits) before its first poll
-- checks the database, and the push looks after its own commit. Unlogged: after a
-- crash, workers list themselves again within a fallback period.
CREATE UNLOGGED TABLE queen.waiting_workers (
    worker text PRIMARY KEY,
    until  timestamptz NOT NULL
);

-- One row per token made by `queen token create`. Only a SHA-256 hash of the token is
-- kept (the token itself is shown once); requests find their token by that hash.
-- A revoked token keeps its row, so its name stays taken and the producer recorded on
-- its messages keeps naming one token.
CREATE TABLE queen.tokens (
    name        text COLLATE "C" PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    role        text NOT NULL CHECK (role IN ('admin', 'producer', 'consumer', 'reader')),
    queues      text NOT NULL DEFAULT '*',            -- comma-separated fnmatch globs
    rate        double precision CHECK (rate > 0),    -- requests per second; NULL: no limit
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- What a pop answers for each message (the API's shape: id is the message's UUID).
CREATE TYPE queen.popped AS (
    id uuid, transaction_id text, queue text, partition text, payload jsonb,
    encrypted boolean, retry_count integer, priority integer, created_at timestamptz,
    locked_at timestamptz, lease_id uuid, lease_expires_at timestamptz,
    lease_time integer, retry_limit integer
);

-- Where a push item goes: its queue and partition by name, then by id once they exist.
CREATE TYPE queen.push_target AS (queue text, partition text, partition_id uuid, queue_id uuid);

-- One item of a push as stored (idx: its position in the request).
CREATE TYPE queen.push_item AS (
    idx integer, id bigint, transaction_id text, partition_id uuid, queue_id uuid,
    payload jsonb, encrypted boolean, trace_id text
);

-- What a pop returns for each message (queen.store.lifecycle.Delivery).
CREATE TYPE queen.delivery AS (
    id bigint, transaction_id text, queue text, partition text, consumer_group text,
    payload jsonb, encrypted boolean, producer text, trace_id text, retry_count integer,
    created_at timestamptz, lease_id uuid, lease_expires_at timestamptz
);

-- What an acknowledgment decided (queen.ack_rows; applied: it changed something,
-- rather than reporting what was already so).
CREATE TYPE queen.ack_outcome AS (
    idx integer, transaction_id text, consumer_group text, message_id bigint,
    status text, retry_count integer, error text, applied boolean
);

-- Deleted messages (retention, admin delete, clear) leave the counts and take their
-- failure records along. A statement trigger: pushes do not fire it. A trigger needs
-- its function: this empty one is replaced by sql/functions/ in the same migrate.
CREATE FUNCTION queen.messages_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER messages_deleted AFTER DELETE ON queen.messages
REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
EXECUTE FUNCTION queen.messages_deleted();
