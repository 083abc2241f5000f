-- A popped message carries its bigint id too, so that a server can make the API id
-- (queen.message_uuid) itself, for less than SQL spends on it (docs/PERFORMANCE.md). A
-- pop that asks for the bigint ids (queen.pop_many's p_api_ids false) leaves id NULL.
ALTER TYPE queen.popped ADD ATTRIBUTE message_id bigint;
