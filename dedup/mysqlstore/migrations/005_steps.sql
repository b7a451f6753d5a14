-- The effect journal (dedup.Journal): a row per step of a message — a call
-- to a system outside this database — with its state, the provider's
-- idempotency key, the attempts, the holder's lease and fencing token, and
-- the provider's answer, and the fingerprint of the request it answers.
-- Times are UTC.
CREATE TABLE IF NOT EXISTS {{.Steps}} (
    scope            VARCHAR(128) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    `key`            VARCHAR(256) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    step             VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    state            ENUM('pending', 'succeeded', 'failed', 'unknown', 'in_doubt') NOT NULL,
    provider_key     VARCHAR(1000) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    fingerprint      BINARY(32)   NULL, -- of the request that began the step; NULL: none
    attempts         INT          NOT NULL,
    token            BIGINT       NOT NULL,
    lease_expires_at DATETIME(6)  NOT NULL,
    first_attempt_at DATETIME(6)  NOT NULL,
    last_attempt_at  DATETIME(6)  NOT NULL,
    result           LONGBLOB     NULL,
    `error`          TEXT CHARACTER SET utf8mb4 NOT NULL,
    updated_at       DATETIME(6)  NOT NULL,
    PRIMARY KEY (scope, `key`, step),
    KEY {{call .Name "steps_first"}} (state, first_attempt_at),
    CONSTRAINT {{call .Name "step_len"}} CHECK (octet_length(step) BETWEEN 1 AND 200),
    CONSTRAINT {{call .Name "step_attempts"}} CHECK (attempts > 0),
    CONSTRAINT {{call .Name "step_token"}} CHECK (token > 0)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = {{.Collation}}
