-- Entity watermarks (dedup.Watermarks): a row per entity of a scope, with
-- the highest version applied, moved forward only in the transaction of
-- the claim. expires_at is at least the last advance plus the scope's
-- retention and at most one and a half times it (NULL: kept for ever): an
-- advance keeps expires_at while it is a retention away or more, and sets
-- it to now() plus one and a half retentions otherwise. Purge forgets a
-- watermark past it, as it forgets a key. Rows are updated in place, most
-- without changing an indexed column: a fillfactor leaves room on the page
-- for HOT updates (Postgres; as for the offsets).
CREATE TABLE IF NOT EXISTS {{.Watermarks}} (
    scope      text        NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 128),
    entity     text        NOT NULL CHECK (octet_length(entity) BETWEEN 1 AND 200),
    major      bigint      NOT NULL,
    minor      bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    PRIMARY KEY (scope, entity)
)
{{- if not .Distributed}} WITH (fillfactor = 70){{end}};
CREATE INDEX IF NOT EXISTS {{call .Index "watermarks_expires"}} ON {{.Watermarks}} (expires_at) WHERE expires_at IS NOT NULL;
-- The stale events: an event at or below its entity's watermark, with the
-- message's key, both versions and when it was recorded (the database's
-- clock), in the same transaction; purged past the scope's retention.
CREATE TABLE IF NOT EXISTS {{.Stale}} (
    id         bigserial   PRIMARY KEY,
    scope      text        NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 128),
    key        text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 256),
    entity     text        NOT NULL CHECK (octet_length(entity) BETWEEN 1 AND 200),
    major      bigint      NOT NULL,
    minor      bigint      NOT NULL,
    mark_major bigint      NOT NULL,
    mark_minor bigint      NOT NULL,
    at         timestamptz NOT NULL,
    expires_at timestamptz
);
CREATE INDEX IF NOT EXISTS {{call .Index "stale_entity"}} ON {{.Stale}} (scope, entity);
CREATE INDEX IF NOT EXISTS {{call .Index "stale_expires"}} ON {{.Stale}} (expires_at) WHERE expires_at IS NOT NULL;
