-- A lease of two or more messages keeps a digest of its transactionIds in delivery
-- order (queen.lease_digest), set by the pop that takes it: an ack naming exactly those
-- messages, in that order, is matched to the lease by comparing digests, without
-- reading the messages again (queen.ack_whole_leases). NULL: no digest (one message,
-- or the lease changed since the pop).
ALTER TABLE queen.consumers ADD COLUMN lease_digest bigint;
