-- The effect journal (dedup.Journal): a row per step of a message — a call
-- to a system outside this database — with its state, the provider's
-- idempotency key, the attempts, the holder's lease and fencing token
-- (drawn from the counter of lease tokens, see requests.go), and the
-- provider's answer, and the fingerprint of the request it answers. Times are Unix milliseconds.
CREATE TABLE IF NOT EXISTS {{.Steps}} (
    scope            TEXT    NOT NULL CHECK (length(CAST(scope AS BLOB)) BETWEEN 1 AND 128),
    key              TEXT    NOT NULL CHECK (length(CAST(key AS BLOB)) BETWEEN 1 AND 256),
    step             TEXT    NOT NULL CHECK (length(CAST(step AS BLOB)) BETWEEN 1 AND 200),
    state            TEXT    NOT NULL CHECK (state IN ('pending', 'succeeded', 'failed', 'unknown', 'in_doubt')),
    provider_key     TEXT    NOT NULL,
    fingerprint      BLOB    CHECK (length(fingerprint) = 32), -- of the request that began the step; NULL: none
    attempts         INTEGER NOT NULL CHECK (attempts > 0),
    token            INTEGER NOT NULL CHECK (token > 0),
    lease_expires_at INTEGER NOT NULL,
    first_attempt_at INTEGER NOT NULL,
    last_attempt_at  INTEGER NOT NULL,
    result           BLOB,
    error            TEXT    NOT NULL DEFAULT '',
    updated_at       INTEGER NOT NULL,
    PRIMARY KEY (scope, key, step)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {{call .Index "steps_open"}} ON {{.Steps}} (first_attempt_at)
    WHERE state IN ('pending', 'unknown', 'in_doubt');
