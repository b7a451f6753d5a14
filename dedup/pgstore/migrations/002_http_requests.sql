-- The request record of an HTTP Idempotency-Key (package httpidem), beside
-- the key's row in the dedup table: one key space, one retention. Purging
-- the key's row deletes its record (ON DELETE CASCADE).
CREATE TABLE IF NOT EXISTS {{call .Sibling "http"}} (
    scope            text        NOT NULL,
    key              text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('processing', 'finished')),
    -- The fencing token: 1 for the first lease, one more on every takeover
    -- and release; a write with an older token is refused.
    token            bigint      NOT NULL DEFAULT 1 CHECK (token > 0),
    lease_expires_at timestamptz,
    status           smallint    CHECK (status BETWEEN 100 AND 999),
    header           bytea,
    body             bytea,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key),
    FOREIGN KEY (scope, key) REFERENCES {{.Table}} (scope, key) ON DELETE CASCADE,
    CHECK (state = 'processing' OR status IS NOT NULL)
);
-- Stuck keys: Processing past their lease.
CREATE INDEX IF NOT EXISTS {{call .Index "http_lease"}} ON {{call .Sibling "http"}} (lease_expires_at) WHERE state = 'processing';
