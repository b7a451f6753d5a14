-- The outbox: one row per outgoing message, written in the transaction of
-- the work that produced it. Postgres 13 or later (xid8).
CREATE TABLE IF NOT EXISTS {{.Table}} (
    seq           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- the message's identity: MessageID(parent_scope, parent_key, position)
    id            text        NOT NULL CHECK (octet_length(id) = 32),
    parent_scope  text        NOT NULL CHECK (octet_length(parent_scope) BETWEEN 1 AND 128),
    parent_key    text        NOT NULL CHECK (octet_length(parent_key) BETWEEN 1 AND 256),
    position      int         NOT NULL CHECK (position >= 0),
    -- the transaction that wrote (or re-enqueued) the row: positions count
    -- from 0 within one transaction
    tx            xid8        NOT NULL DEFAULT pg_current_xact_id(),
    -- which relay lock covers the row: a hash of (topic, key)
    shard         smallint    NOT NULL CHECK (shard >= 0),
    topic         text        NOT NULL CHECK (octet_length(topic) BETWEEN 1 AND 249),
    key           bytea,
    value         bytea,
    header_keys   text[]      NOT NULL DEFAULT '{}',
    header_values bytea[]     NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- NULL until published; set only when sent rows are retained
    sent_at       timestamptz,
    UNIQUE (parent_scope, parent_key, position)
);
CREATE INDEX IF NOT EXISTS {{call .Index "pending"}} ON {{.Table}} (shard, seq) WHERE sent_at IS NULL;
CREATE INDEX IF NOT EXISTS {{call .Index "sent"}} ON {{.Table}} (sent_at) WHERE sent_at IS NOT NULL;

-- Messages the broker refused for good (too large, an invalid topic), moved
-- here by the relay with the reason. Nothing purges this table.
CREATE TABLE IF NOT EXISTS {{.Dead}} (
    seq           bigint      PRIMARY KEY,
    id            text        NOT NULL,
    parent_scope  text        NOT NULL,
    parent_key    text        NOT NULL,
    position      int         NOT NULL,
    topic         text        NOT NULL,
    key           bytea,
    value         bytea,
    header_keys   text[]      NOT NULL,
    header_values bytea[]     NOT NULL,
    created_at    timestamptz NOT NULL,
    failed_at     timestamptz NOT NULL DEFAULT now(),
    reason        text        NOT NULL
);
