-- A transactionId Queen makes (a push naming none) is derived from the message's
-- partition and id (queen.made_txid), not stored: only a client's own is, and only those
-- are in the unique index. Rows stored before keep theirs, and their index entries.
ALTER TABLE queen.messages ALTER COLUMN transaction_id DROP NOT NULL;
CREATE UNIQUE INDEX messages_transaction_id ON queen.messages (transaction_id)
    WHERE transaction_id IS NOT NULL;
ALTER TABLE queen.messages DROP CONSTRAINT messages_transaction_id_key;
-- The partition a made transactionId names, found by equality: the 60 bits of its id that
-- the transactionId carries (queen.named).
CREATE INDEX partitions_made ON queen.partitions ((left(id::text, 13) || substr(id::text, 16, 3)));
