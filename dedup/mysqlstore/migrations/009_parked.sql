-- A parked key's messages (008), by their original's identity, in
-- position order: the head first.
CREATE TABLE IF NOT EXISTS {{.Parked}} (
    scope VARBINARY(128)  NOT NULL,
    topic VARBINARY(1000) NOT NULL,
    `key` VARBINARY(1000) NOT NULL,
    id    VARBINARY(400)  NOT NULL,
    pos   BIGINT          NOT NULL,
    PRIMARY KEY (scope, topic, `key`, id),
    UNIQUE KEY {{call .Name "parked_pos"}} (scope, topic, `key`, pos),
    CONSTRAINT {{call .Name "parked_id_len"}} CHECK (octet_length(id) >= 1)
) ENGINE = InnoDB
