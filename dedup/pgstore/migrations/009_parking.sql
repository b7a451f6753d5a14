-- Parked keys (dedup.Parking, consumer.NonBlocking.KeyOrdered): a row per
-- record key of a scope and a topic that has a message in retry, with its
-- head (the message tried), the delay the head went to retry with, how
-- many messages it holds and the position the next one takes, when it was
-- parked and when its head became the head (the consumer's clock), and
-- whether it outlived its limits. A key's row is the lock of its
-- messages: every change takes it first. The record key is bytes.
-- Deleted when the key is released; no retention, no partitions. In
-- distributed mode the same tables without a fillfactor, and without a
-- shard column: few rows, short-lived, not monotonic.
CREATE TABLE IF NOT EXISTS {{.ParkedKeys}} (
    scope         text        NOT NULL CHECK (octet_length(scope) <= 128),
    topic         text        NOT NULL CHECK (octet_length(topic) BETWEEN 1 AND 1000),
    key           bytea       NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 1000),
    head          text        NOT NULL,
    head_delay_ns bigint      NOT NULL,
    depth         int         NOT NULL CHECK (depth >= 0),
    next_pos      bigint      NOT NULL,
    parked_at     timestamptz NOT NULL,
    head_since    timestamptz NOT NULL,
    expired       boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (scope, topic, key)
)
{{- if not .Distributed}} WITH (fillfactor = 70){{end}};
CREATE INDEX IF NOT EXISTS {{call .Index "parked_keys_at"}} ON {{.ParkedKeys}} (parked_at);
-- A parked key's messages, by their original's identity, in position
-- order: the head first.
CREATE TABLE IF NOT EXISTS {{.Parked}} (
    scope text   NOT NULL,
    topic text   NOT NULL,
    key   bytea  NOT NULL,
    id    text   NOT NULL CHECK (octet_length(id) BETWEEN 1 AND 400),
    pos   bigint NOT NULL,
    PRIMARY KEY (scope, topic, key, id)
);
CREATE UNIQUE INDEX IF NOT EXISTS {{call .Index "parked_pos"}} ON {{.Parked}} (scope, topic, key, pos);
