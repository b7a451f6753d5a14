CREATE TABLE IF NOT EXISTS {{.Epochs}} (
    scope         VARCHAR(128) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    epoch         BIGINT       NOT NULL,
    release_token BIGINT       NULL,
    release_until DATETIME(6)  NULL,
    PRIMARY KEY (scope),
    CONSTRAINT {{call .Name "ep_scope_len"}} CHECK (octet_length(scope) BETWEEN 1 AND 128)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = {{.Collation}}
