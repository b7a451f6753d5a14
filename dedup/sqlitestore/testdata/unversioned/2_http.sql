-- The HTTP request columns the unversioned Migrate added (httpidem's
-- release on), verbatim.
ALTER TABLE "idem_dedup" ADD COLUMN state TEXT CHECK (state IN ('processing', 'finished'));
ALTER TABLE "idem_dedup" ADD COLUMN token INTEGER CHECK (token > 0);
ALTER TABLE "idem_dedup" ADD COLUMN lease_expires_at INTEGER;
ALTER TABLE "idem_dedup" ADD COLUMN status INTEGER CHECK (status BETWEEN 100 AND 999);
ALTER TABLE "idem_dedup" ADD COLUMN header BLOB;
ALTER TABLE "idem_dedup" ADD COLUMN body BLOB;
CREATE INDEX IF NOT EXISTS "idem_dedup_lease" ON "idem_dedup" (lease_expires_at) WHERE state = 'processing';
