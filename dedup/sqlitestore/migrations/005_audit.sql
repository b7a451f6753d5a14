-- The operators' audit log (dedup.Auditor): each action the idem command
-- or its console executed (a release, a redrive, a skip, a purge), who
-- executed it, when (milliseconds since the epoch), the plan it executed
-- as JSON and its outcome.
CREATE TABLE IF NOT EXISTS {{.Audit}} (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL DEFAULT ({{.Now}}),
    actor   TEXT    NOT NULL CHECK (length(CAST(actor AS BLOB)) BETWEEN 1 AND 256),
    kind    TEXT    NOT NULL CHECK (length(CAST(kind AS BLOB)) BETWEEN 1 AND 64),
    plan    TEXT    NOT NULL CHECK (json_valid(plan)),
    outcome TEXT    NOT NULL CHECK (length(CAST(outcome AS BLOB)) BETWEEN 1 AND 2000)
);
