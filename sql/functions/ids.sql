-- Ids: time-ordered UUIDs, and the API's UUID of a message made of its bigint id and
-- created_at (and read back).

-- Time-ordered UUID (RFC 9562 version 7).
CREATE OR REPLACE FUNCTION queen.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

-- The API's UUID of a message: UUIDv7-shaped, its 48-bit time the message's created_at
-- (ms), its 74 random bits the message id (bigint), so it is unique, sorts by time, and
-- needs no column. The one definition: every answer naming a message uses it. Built as
-- two big-endian bigints (time, version and the id's top bits; variant and its low 62
-- bits) read as hex. Only immutable parts (the epoch of an interval, not of a
-- timestamptz, which is stable), so that queries inline it instead of calling it once per
-- message (a push and a pop make one per message).
CREATE OR REPLACE FUNCTION queen.message_uuid(p_id bigint, p_created_at timestamptz)
RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(int8send((floor(extract(epoch FROM p_created_at - 'epoch'::timestamptz)
                                  * 1000)::bigint & 281474976710655) << 16
                           | 28672 | ((p_id >> 62) & 4095))
                  || int8send((p_id & 4611686018427387903) | (-9223372036854775807 - 1)),
                  'hex')::uuid
$$;

-- The API ids of many messages created at one time (a push), as text: what
-- queen.message_uuid gives, cut after its first 24 characters (the time, the
-- version and the variant, which the id reaches only from 2^48 on) for
-- queen.message_uuid_text to complete. Computed once per call, not per message.
CREATE OR REPLACE FUNCTION queen.uuid_prefix(p_created_at timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(queen.message_uuid(0, p_created_at)::text, 24)
$$;

-- queen.message_uuid(p_id, p_created_at)::text, given p_prefix =
-- queen.uuid_prefix(p_created_at): the id's 12 hex digits appended (cheaper than
-- building the whole UUID), or the whole UUID for an id of 2^48 or more.
CREATE OR REPLACE FUNCTION queen.message_uuid_text(p_id bigint, p_prefix text,
                                                   p_created_at timestamptz)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_id >= 0 AND p_id < 281474976710656
                THEN p_prefix || lpad(to_hex(p_id), 12, '0')
                ELSE queen.message_uuid(p_id, p_created_at)::text END
$$;

-- The bigint id of a message from its API id (queen.message_uuid above: its low
-- 62 bits, and above them the 12 bits after the version).
CREATE OR REPLACE FUNCTION queen.message_id_of(p_uuid uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (('x' || substr(replace(p_uuid::text, '-', ''), 14, 3))::bit(12)::bigint << 62)
           | (('x' || right(replace(p_uuid::text, '-', ''), 16))::bit(64)::bigint
              & 4611686018427387903)
$$;

-- A lease's id names its partition: its first 6 bytes are the partition id's, its
-- version 8 (RFC 9562's vendor layout), and the rest the id the claim was made under
-- (p_chosen, the caller's: its last 8 bytes are kept, which is how a caller that lost
-- the answer still names the lease: queen.give_back). No index covers lease_id, so that
-- claims and acks stay HOT updates; a lookup by lease id instead reads the consumer rows
-- of the partitions sharing that prefix, by the primary key (queen.lease_low/high).
-- (Made on the ids' text, whose first 13 characters are the first 6 bytes and whose
-- 15th is the version digit: cheaper than the same on their bytes.)
CREATE OR REPLACE FUNCTION queen.lease_in(p_partition uuid, p_chosen uuid) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (left(p_partition::text, 14) || '8' || substr(p_chosen::text, 16))::uuid
$$;

-- Whether a lease id is of queen.lease_in's making (version 8).
CREATE OR REPLACE FUNCTION queen.lease_placed(p_lease uuid) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT get_byte(uuid_send(p_lease), 6) >> 4 = 8
$$;

-- The lowest or highest partition id a lease may be on (p_fill: 16 bytes of 00, or of
-- ff): those sharing its first 6 bytes; for an id of another making (a caller's own, or
-- one made before leases named their partition) every partition.
CREATE OR REPLACE FUNCTION queen.lease_bound(p_lease uuid, p_fill bytea) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT encode(CASE WHEN queen.lease_placed(p_lease)
                       THEN substring(uuid_send(p_lease) FROM 1 FOR 6)
                       ELSE substring(p_fill FROM 1 FOR 6) END
                  || substring(p_fill FROM 7), 'hex')::uuid
$$;

CREATE OR REPLACE FUNCTION queen.lease_low(p_lease uuid) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT queen.lease_bound(p_lease, '\x00000000000000000000000000000000')
$$;

CREATE OR REPLACE FUNCTION queen.lease_high(p_lease uuid) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT queen.lease_bound(p_lease, '\xffffffffffffffffffffffffffffffff')
$$;

-- The transactionId a message gets when its push names none: made of its partition's id
-- and its own, so it is stored nowhere (no column value, no index entry) and still names
-- the message alone. A version 8 UUID (RFC 9562's vendor layout), as lowercase text:
-- the partition id's first 60 bits after its version (its first 13 characters and the
-- 3 after its version digit), then the variant and the message id's 62 bits. The text
-- is queen.made_prefix(partition) and the id's part (queen.made_txid; the server makes
-- it the same way). A stored transactionId, a client's, wins: queen.txid.
CREATE OR REPLACE FUNCTION queen.made_prefix(p_partition uuid) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(p_partition::text, 14) || '8' || substr(p_partition::text, 16, 3) || '-'
$$;

-- (p_prefix: queen.made_prefix of the partition, computed once for many messages.)
CREATE OR REPLACE FUNCTION queen.made_txid_text(p_prefix text, p_id bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_prefix || CASE WHEN p_id BETWEEN 0 AND 281474976710655
                            THEN '8000-' || lpad(to_hex(p_id), 12, '0')
                            ELSE to_hex(32768 | ((p_id >> 48) & 16383)) || '-'
                                 || lpad(to_hex(p_id & 281474976710655), 12, '0') END
$$;

CREATE OR REPLACE FUNCTION queen.made_txid(p_partition uuid, p_id bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT queen.made_txid_text(queen.made_prefix(p_partition), p_id)
$$;

-- A message's transactionId: the one stored (a client's), or the one made of its ids.
CREATE OR REPLACE FUNCTION queen.txid(p_stored text, p_partition uuid, p_id bigint)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(p_stored, queen.made_txid(p_partition, p_id))
$$;

-- Whether a transactionId has the form queen.made_txid makes. (Its version digit first:
-- a client's UUIDs of other versions skip the regular expression. STABLE, as
-- queen.made_id, which calls it.)
CREATE OR REPLACE FUNCTION queen.made_form(p_txid text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN substr(p_txid, 15, 1) <> '8' THEN false
                ELSE p_txid ~ ('^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-'
                               '[89ab][0-9a-f]{3}-[0-9a-f]{12}$') END
$$;

-- (Earlier builds found a made transactionId's partition in a range of ids.)
DROP FUNCTION IF EXISTS queen.made_low(text);
DROP FUNCTION IF EXISTS queen.made_high(text);

-- The message id a made transactionId names, NULL for any other. (A match, then string
-- functions: a regular expression with a group to capture costs several times more.
-- STABLE, not IMMUTABLE: a constant argument would be evaluated at planning, a call of
-- its own, and a custom plan with a branch of queen.named folded away would look cheaper
-- than the generic one at every call, so PL/pgSQL would plan each call again.)
CREATE OR REPLACE FUNCTION queen.made_id(p_txid text) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN queen.made_form(p_txid)
                THEN ('x' || replace(right(p_txid, 17), '-', ''))::bit(64)::bigint
                     & 4611686018427387903 END
$$;

-- The message a transactionId names, if any: a client's by the unique index of stored
-- ones, a made one by its partition (the 60 bits of the partition's id it carries, by
-- the index partitions_made: an array, not a join, which the planner would give a cache
-- to set up at every call) and id (one probe of the messages' key). A made
-- transactionId names only a message that stores none; a stored one of that form (a
-- message written again at its partition's tail keeps its own) is found by the index
-- first. A client's is never of that form (queen.check_made_txids).
CREATE OR REPLACE FUNCTION queen.named(p_txid text)
RETURNS TABLE (partition_id uuid, id bigint)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT m.partition_id, m.id FROM queen.messages m WHERE m.transaction_id = p_txid
    UNION ALL
    SELECT m.partition_id, m.id
    FROM queen.messages m
    WHERE m.partition_id = ANY (ARRAY(SELECT p.id FROM queen.partitions p
                                      WHERE left(p.id::text, 13) || substr(p.id::text, 16, 3)
                                            = left(p_txid, 13) || substr(p_txid, 16, 3)))
      AND m.id = queen.made_id(p_txid) AND m.transaction_id IS NULL
    LIMIT 1
$$;
