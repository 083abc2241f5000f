-- A popped message carries its producer's trace context (W3C traceparent, stored at push
-- as messages.trace_id), so a consumer can continue the producer's trace.
ALTER TYPE queen.popped ADD ATTRIBUTE trace_id text;
