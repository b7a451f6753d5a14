-- Parked keys (dedup.Parking, consumer.NonBlocking.KeyOrdered): a row per
-- record key of a scope and a topic that has a message in retry, with its
-- head (the message tried), the delay the head went to retry with (in
-- nanoseconds), how many messages it holds and the position the next one
-- takes, when it was parked and when its head became the head (the
-- consumer's clock, Unix microseconds), and whether it outlived its
-- limits; and the key's messages, in position order, the head first. The
-- record key is bytes. A key's row is deleted when it is released.
CREATE TABLE IF NOT EXISTS {{.ParkedKeys}} (
    scope         TEXT    NOT NULL CHECK (length(CAST(scope AS BLOB)) <= 128),
    topic         TEXT    NOT NULL CHECK (length(CAST(topic AS BLOB)) BETWEEN 1 AND 1000),
    key           BLOB    NOT NULL CHECK (length(key) BETWEEN 1 AND 1000),
    head          TEXT    NOT NULL,
    head_delay_ns INTEGER NOT NULL,
    depth         INTEGER NOT NULL CHECK (depth >= 0),
    next_pos      INTEGER NOT NULL,
    parked_at     INTEGER NOT NULL,
    head_since    INTEGER NOT NULL,
    expired       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, topic, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {{call .Index "parked_keys_at"}} ON {{.ParkedKeys}} (parked_at);
CREATE TABLE IF NOT EXISTS {{.Parked}} (
    scope TEXT    NOT NULL,
    topic TEXT    NOT NULL,
    key   BLOB    NOT NULL,
    id    TEXT    NOT NULL CHECK (length(CAST(id AS BLOB)) BETWEEN 1 AND 400),
    pos   INTEGER NOT NULL,
    PRIMARY KEY (scope, topic, key, id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS {{call .Index "parked_pos"}} ON {{.Parked}} (scope, topic, key, pos);
