-- A transactionId Queen makes (a push naming none) is derived from the message's
-- partition and id (queen.made_txid), not stored: only a client's own is, and only those
-- are in the unique index. Rows stored before keep theirs, and their index entries.
ALTER TABLE queen.messages ALTER COLUMN transaction_id DROP NOT NULL;
CREATE UNIQUE INDEX messages_transaction_id ON queen.messages (transaction_id)
    WHERE transaction_id IS NOT NULL;
ALTER TABLE queen.messages DROP CONSTRAINT messages_transaction_id_key;
