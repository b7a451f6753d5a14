-- Entity watermarks (dedup.Watermarks): a row per entity of a scope, with
-- the highest version applied, moved forward only in the transaction of
-- the claim; and the stale events, with the message's key and both
-- versions. Times are Unix milliseconds; expires_at is the last advance
-- (the record's time) plus the scope's retention, NULL: kept for ever.
-- Purge forgets a watermark past it, as it forgets a key.
CREATE TABLE IF NOT EXISTS {{.Watermarks}} (
    scope      TEXT    NOT NULL CHECK (length(CAST(scope AS BLOB)) BETWEEN 1 AND 128),
    entity     TEXT    NOT NULL CHECK (length(CAST(entity AS BLOB)) BETWEEN 1 AND 200),
    major      INTEGER NOT NULL,
    minor      INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    expires_at INTEGER,
    PRIMARY KEY (scope, entity)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {{call .Index "watermarks_expires"}} ON {{.Watermarks}} (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS {{.Stale}} (
    id         INTEGER PRIMARY KEY,
    scope      TEXT    NOT NULL CHECK (length(CAST(scope AS BLOB)) BETWEEN 1 AND 128),
    key        TEXT    NOT NULL CHECK (length(CAST(key AS BLOB)) BETWEEN 1 AND 256),
    entity     TEXT    NOT NULL CHECK (length(CAST(entity AS BLOB)) BETWEEN 1 AND 200),
    major      INTEGER NOT NULL,
    minor      INTEGER NOT NULL,
    mark_major INTEGER NOT NULL,
    mark_minor INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    expires_at INTEGER
);
CREATE INDEX IF NOT EXISTS {{call .Index "stale_entity"}} ON {{.Stale}} (scope, entity);
CREATE INDEX IF NOT EXISTS {{call .Index "stale_expires"}} ON {{.Stale}} (expires_at) WHERE expires_at IS NOT NULL;
