-- 0006: the cursor store, beside the message rows of 0001 (which it will replace).
-- Messages are written once and never updated; what a consumer group has done with them
-- is one row per (partition, group): a cursor, a lease and the retry state past the
-- cursor. Failures and completions are records of their own, written when they happen.
-- The functions are in sql/functions/cursor_*.sql (installed on every migrate).

-- retryDelay: how long a failed message waits before its redelivery (ms); its
-- partition waits with it (FIFO).
ALTER TABLE queen.queues ADD COLUMN retry_delay integer NOT NULL DEFAULT 0;

-- Immutable messages. Ids come from one identity, drawn by a push while it holds its
-- partitions' push locks (queen.cursor_push_lock_key) until it commits: within a
-- partition, ids are in commit order, so a reader that sees a message has seen every
-- message of the partition with a lower id, and a cursor never passes one that commits
-- later.
CREATE TABLE queen.cursor_messages (
    id             bigint GENERATED ALWAYS AS IDENTITY,
    partition_id   uuid NOT NULL,                 -- queen.partitions (no key: see queen.messages)
    transaction_id text COLLATE "C" NOT NULL,     -- unique system-wide
    payload        jsonb NOT NULL,
    encrypted      boolean NOT NULL DEFAULT false,
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
CREATE TABLE queen.cursor_groups (
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
-- the highest id with a retry record (queen.cursor_failures) past the cursor: a pop looks
-- retry counts up only below it. not_before holds the partition back (retryDelay).
CREATE TABLE queen.cursor_consumers (
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
CREATE INDEX cursor_consumers_group ON queen.cursor_consumers (queue_id, consumer_group);
-- No index covers a lease column: a pop and the ack that ends its lease then change no
-- indexed value, and PostgreSQL updates the row in place (HOT), with no index entry.
-- Lease extension and expiry read the table (one row per partition and group) instead.

-- A message's failures for one group, one row updated in place: status 'retry' while it
-- waits for redelivery with retry_count retries, 'dead_letter' or 'failed' for good.
CREATE TABLE queen.cursor_failures (
    partition_id   uuid NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    message_id     bigint NOT NULL,
    status         text NOT NULL CHECK (status IN ('retry', 'dead_letter', 'failed')),
    retry_count    integer NOT NULL,
    error          text,
    failed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group, message_id)
);
CREATE INDEX cursor_failures_final ON queen.cursor_failures (failed_at) WHERE status <> 'retry';

-- Completions: one row per ack call and (partition, group), covering the ids it
-- completed (first_id..last_id, count of them); never one row per message.
CREATE TABLE queen.cursor_completions (
    partition_id   uuid NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    first_id       bigint NOT NULL,
    last_id        bigint NOT NULL,
    acked          integer NOT NULL,
    acked_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cursor_completions_range
    ON queen.cursor_completions (partition_id, consumer_group, last_id);

-- What an acknowledgment of the cursor store decided (queen.cursor_ack; applied: it
-- changed something, rather than reporting what was already so).
CREATE TYPE queen.cursor_ack_outcome AS (
    idx integer, transaction_id text, consumer_group text, message_id bigint,
    status text, retry_count integer, error text, applied boolean
);

-- One item of a cursor push as stored (idx: its position in the request).
CREATE TYPE queen.cursor_push_item AS (
    idx integer, id bigint, transaction_id text, partition_id uuid, queue_id uuid,
    payload jsonb, encrypted boolean, trace_id text
);

-- What a pop of the cursor store returns for each message.
CREATE TYPE queen.cursor_popped AS (
    id bigint, transaction_id text, queue text, partition text, consumer_group text,
    payload jsonb, encrypted boolean, producer text, trace_id text, retry_count integer,
    created_at timestamptz, lease_id uuid, lease_expires_at timestamptz
);
