-- The effect journal (dedup.Journal): a row per step of a message — a call
-- to a system outside this database — with its state, the provider's
-- idempotency key, the attempts, the holder's lease and fencing token, and
-- the provider's answer, and the fingerprint of the request it answers. Tokens come from the same source as the request
-- leases' (pg_current_xact_id, see requests.go), so they only grow, also
-- across a purge. A plain table in every layout: few rows. A succeeded or
-- failed step is purged with its key's row (never a step whose key has no
-- row), by primary key.
CREATE TABLE IF NOT EXISTS {{.Steps}} (
    scope            text        NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 128),
    key              text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 256),
    step             text        NOT NULL CHECK (octet_length(step) BETWEEN 1 AND 200),
    state            text        NOT NULL CHECK (state IN ('pending', 'succeeded', 'failed', 'unknown', 'in_doubt')),
    provider_key     text        NOT NULL,
    -- The payload fingerprint of the request that began the step; NULL: none.
    fingerprint      bytea       CHECK (octet_length(fingerprint) = 32),
    attempts         int         NOT NULL CHECK (attempts > 0),
    token            bigint      NOT NULL CHECK (token > 0),
    lease_expires_at timestamptz NOT NULL, -- the lease of the holder, past once it ended
    first_attempt_at timestamptz NOT NULL,
    last_attempt_at  timestamptz NOT NULL,
    result           bytea,
    error            text        NOT NULL DEFAULT '',
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key, step)
);
-- Operators' listing of the unresolved steps, the oldest first attempt first.
CREATE INDEX IF NOT EXISTS {{call .Index "steps_open"}} ON {{.Steps}} (first_attempt_at)
    WHERE state IN ('pending', 'unknown', 'in_doubt');
