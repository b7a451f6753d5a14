CREATE TABLE IF NOT EXISTS {{.Table}} (
{{- if .Distributed}}
    shard       int2        NOT NULL CHECK (shard BETWEEN 0 AND 15), -- hash of (scope, key) computed by each INSERT: distributed mode
{{- end}}
    scope       text        NOT NULL CHECK (octet_length(scope) BETWEEN 1 AND 128),
    key         text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 256),
    fingerprint bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    outcome     text        NOT NULL DEFAULT 'done' CHECK (outcome IN ('done', 'failed')),
    reason      text        CHECK (octet_length(reason) <= 500),
    source      text,
    created_at  timestamptz NOT NULL DEFAULT now(),
{{- if .Partitioned}}
    expires_at  timestamptz NOT NULL, -- 'infinity': kept for ever
    -- Partitioned mode (Config.PartitionWidth): a unique index must hold
    -- the partition key; the store keeps (scope, key) unique across
    -- partitions itself (partitions.go). Partitions: made by the store.
    PRIMARY KEY (scope, key, expires_at)
) PARTITION BY RANGE (expires_at);
{{- else}}
    expires_at  timestamptz,
    PRIMARY KEY ({{if .Distributed}}shard, {{end}}scope, key)
);
{{- end}}
CREATE INDEX IF NOT EXISTS {{call .Index "expires"}} ON {{.Table}} (expires_at) WHERE expires_at IS NOT NULL;
