-- The counter of lease tokens (tokens that grow across a purge), verbatim.
CREATE TABLE IF NOT EXISTS "idem_dedup_tokens" (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL CHECK (last >= 0)
);
INSERT OR IGNORE INTO "idem_dedup_tokens" (id, last) SELECT 1, coalesce(max(token), 0) FROM "idem_dedup";
