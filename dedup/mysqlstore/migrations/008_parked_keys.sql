-- Parked keys (dedup.Parking, consumer.NonBlocking.KeyOrdered): a row per
-- record key of a scope and a topic that has a message in retry, with its
-- head (the message tried), the delay the head went to retry with (in
-- nanoseconds), how many messages it holds and the position the next one
-- takes, when it was parked and when its head became the head (the
-- consumer's clock, Unix microseconds), and whether it outlived its
-- limits. A key's row is the lock of its messages (009): every change
-- takes it first. Names are bytes (VARBINARY: compared byte for byte, the
-- record key's bytes as they are). Deleted when the key is released.
CREATE TABLE IF NOT EXISTS {{.ParkedKeys}} (
    scope         VARBINARY(128)  NOT NULL,
    topic         VARBINARY(1000) NOT NULL,
    `key`         VARBINARY(1000) NOT NULL,
    head          VARBINARY(400)  NOT NULL,
    head_delay_ns BIGINT          NOT NULL,
    depth         INT             NOT NULL,
    next_pos      BIGINT          NOT NULL,
    parked_at     BIGINT          NOT NULL,
    head_since    BIGINT          NOT NULL,
    expired       BOOLEAN         NOT NULL DEFAULT FALSE,
    PRIMARY KEY (scope, topic, `key`),
    KEY {{call .Name "parked_keys_at"}} (parked_at),
    CONSTRAINT {{call .Name "parked_key_len"}} CHECK (octet_length(topic) >= 1 AND octet_length(`key`) >= 1)
) ENGINE = InnoDB
