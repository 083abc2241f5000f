-- A popped message names its partition by id too (partitionId), as clients written for
-- the original Queen send it back with each acknowledgment.
ALTER TYPE queen.popped ADD ATTRIBUTE partition_id uuid;
