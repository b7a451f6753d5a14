-- Offsets in the store (consumer.Config.Offsets): per consumer scope and
-- partition, the next offset not yet settled. Every offset below it
-- committed (or was dead-lettered) before; one row update per batch
-- replaces one key row per message. Rows are updated in place, often: a
-- low fillfactor leaves room on the page for HOT updates (Postgres; the
-- distributed databases store rows otherwise and are not given one).
CREATE TABLE IF NOT EXISTS {{.Offsets}} (
    scope       text        NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 128),
    topic       text        NOT NULL CHECK (octet_length(topic) BETWEEN 1 AND 255),
    partition   int         NOT NULL CHECK (partition >= 0),
    next_offset bigint      NOT NULL CHECK (next_offset > 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, topic, partition)
)
{{- if not .Distributed}} WITH (fillfactor = 50){{end}};
