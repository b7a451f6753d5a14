-- The release epochs' table (dedup.EpochStore), verbatim.
CREATE TABLE IF NOT EXISTS "idem_dedup_epochs" (
    scope         TEXT    NOT NULL PRIMARY KEY CHECK (length(CAST(scope AS BLOB)) BETWEEN 1 AND 128),
    epoch         INTEGER NOT NULL CHECK (epoch > 0),
    release_token INTEGER,
    release_until INTEGER
) WITHOUT ROWID;
