-- Release epochs (dedup.EpochStore): per scope, a counter moved forward
-- around every release of the scope's keys, and the release in progress,
-- if any, with the time its hold runs out (see epochs.go).
CREATE TABLE IF NOT EXISTS {{.Epochs}} (
    scope         TEXT    NOT NULL PRIMARY KEY CHECK (length(CAST(scope AS BLOB)) BETWEEN 1 AND 128),
    epoch         INTEGER NOT NULL CHECK (epoch > 0),
    release_token INTEGER,
    release_until INTEGER
) WITHOUT ROWID;
