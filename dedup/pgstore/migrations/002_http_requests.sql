-- HTTP Idempotency-Key requests (package httpidem) keep their state in
-- their key's own row: one key space, one write per request, one purge.
-- A consumer's rows leave these columns NULL.
--
-- Adding nullable columns and a NOT VALID check is instant on a large
-- table. The partial index below is built by reading the table once while
-- writes to it wait; on a large table create it beforehand with
-- CREATE INDEX CONCURRENTLY IF NOT EXISTS (same name and definition), and
-- this migration finds it.
ALTER TABLE {{.Table}}
    ADD COLUMN IF NOT EXISTS state            text,        -- processing | finished; NULL for a consumer's key
    ADD COLUMN IF NOT EXISTS token            bigint,      -- fencing token: 1, one more per takeover and release
    ADD COLUMN IF NOT EXISTS lease_expires_at timestamptz, -- a processing request's lease
    ADD COLUMN IF NOT EXISTS status           smallint,    -- the stored response
    ADD COLUMN IF NOT EXISTS header           bytea,
    ADD COLUMN IF NOT EXISTS body             bytea;
ALTER TABLE {{.Table}} ADD CONSTRAINT {{call .Index "http_check"}} CHECK (
    state IS NULL
    OR state = 'processing' AND token > 0 AND lease_expires_at IS NOT NULL
    OR state = 'finished' AND token > 0 AND status BETWEEN 100 AND 999
) NOT VALID;
-- Stuck keys: processing past their lease.
CREATE INDEX IF NOT EXISTS {{call .Index "lease"}} ON {{.Table}} (lease_expires_at) WHERE state = 'processing';
