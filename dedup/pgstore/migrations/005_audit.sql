-- The operators' audit log (dedup.Auditor): each action the idem command
-- or its console executed (a release, a redrive, a skip, a purge), who
-- executed it, when, the plan it executed as JSON and its outcome.
CREATE TABLE IF NOT EXISTS {{.Audit}} (
    id      bigserial   PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text        NOT NULL CHECK (octet_length(actor) BETWEEN 1 AND 256),
    kind    text        NOT NULL CHECK (octet_length(kind) BETWEEN 1 AND 64),
    plan    jsonb       NOT NULL,
    outcome text        NOT NULL CHECK (octet_length(outcome) BETWEEN 1 AND 2000)
);
