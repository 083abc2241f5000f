-- 0002: alerts an operator sets on a queue (docs/SCHEMA.md). Read by GET /api/v1/alerts,
-- the dashboard and /metrics/prometheus, each evaluating them when asked.

-- kind 'depth': pending messages above threshold; 'lag': the oldest pending message older
-- than threshold seconds; 'dead_letters': more than threshold messages dead-lettered in
-- the last window_minutes.
CREATE TABLE queen.alerts (
    name           text COLLATE "C" PRIMARY KEY,
    queue          text NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('depth', 'lag', 'dead_letters')),
    threshold      double precision NOT NULL CHECK (threshold >= 0),
    window_minutes integer NOT NULL DEFAULT 5 CHECK (window_minutes BETWEEN 1 AND 1440),
    created_at     timestamptz NOT NULL DEFAULT now()
);
