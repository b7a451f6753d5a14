-- The table as sqlitestore's unversioned Migrate created it (from its first
-- release on), verbatim.
CREATE TABLE IF NOT EXISTS "idem_dedup" (
    scope       TEXT    NOT NULL CHECK (length(CAST(scope AS BLOB)) BETWEEN 1 AND 128),
    key         TEXT    NOT NULL CHECK (length(CAST(key AS BLOB)) BETWEEN 1 AND 256),
    fingerprint BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    outcome     TEXT    NOT NULL DEFAULT 'done' CHECK (outcome IN ('done', 'failed')),
    reason      TEXT,
    source      TEXT,
    created_at  INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    expires_at  INTEGER,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS "idem_dedup_expires" ON "idem_dedup" (expires_at) WHERE expires_at IS NOT NULL;
