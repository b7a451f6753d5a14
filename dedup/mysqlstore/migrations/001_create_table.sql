CREATE TABLE IF NOT EXISTS {{.Table}} (
    scope       VARCHAR(128)  CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    `key`       VARCHAR(256)  CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    fingerprint BINARY(32)    NOT NULL,
    outcome     ENUM('done', 'failed') NOT NULL DEFAULT 'done',
    reason      VARCHAR(500)  CHARACTER SET utf8mb4,
    source      VARCHAR(1000) CHARACTER SET utf8mb4,
    claim_token BIGINT UNSIGNED NOT NULL DEFAULT 0,
    created_at  DATETIME(6)   NOT NULL,
    expires_at  DATETIME(6)   NULL,
    PRIMARY KEY (scope, `key`),
    KEY {{call .Name "expires"}} (expires_at),
    CONSTRAINT {{call .Name "scope_len"}} CHECK (octet_length(scope) BETWEEN 1 AND 128),
    CONSTRAINT {{call .Name "key_len"}} CHECK (octet_length(`key`) BETWEEN 1 AND 256)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = {{.Collation}}
