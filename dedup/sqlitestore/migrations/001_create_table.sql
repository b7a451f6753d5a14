-- The dedup table: one row per key. Times are Unix milliseconds by
-- SQLite's clock.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    scope       TEXT    NOT NULL CHECK (length(CAST(scope AS BLOB)) BETWEEN 1 AND 128),
    key         TEXT    NOT NULL CHECK (length(CAST(key AS BLOB)) BETWEEN 1 AND 256),
    fingerprint BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    outcome     TEXT    NOT NULL DEFAULT 'done' CHECK (outcome IN ('done', 'failed')),
    reason      TEXT,
    source      TEXT,
    created_at  INTEGER NOT NULL DEFAULT ({{.Now}}),
    expires_at  INTEGER,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {{call .Index "expires"}} ON {{.Table}} (expires_at) WHERE expires_at IS NOT NULL;
