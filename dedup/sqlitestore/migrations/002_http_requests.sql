-- HTTP Idempotency-Key requests (package httpidem) keep their state in
-- their key's own row: one key space, one write per request, one purge.
-- A consumer's rows leave these columns NULL.
ALTER TABLE {{.Table}} ADD COLUMN state TEXT CHECK (state IN ('processing', 'finished'));
ALTER TABLE {{.Table}} ADD COLUMN token INTEGER CHECK (token > 0);
ALTER TABLE {{.Table}} ADD COLUMN lease_expires_at INTEGER;
ALTER TABLE {{.Table}} ADD COLUMN status INTEGER CHECK (status BETWEEN 100 AND 999);
ALTER TABLE {{.Table}} ADD COLUMN header BLOB;
ALTER TABLE {{.Table}} ADD COLUMN body BLOB;
-- Stuck keys: processing past their lease.
CREATE INDEX IF NOT EXISTS {{call .Index "lease"}} ON {{.Table}} (lease_expires_at) WHERE state = 'processing';
