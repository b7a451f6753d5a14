-- Entity watermarks (dedup.Watermarks): a row per entity of a scope, with
-- the highest version applied, moved forward only in the transaction of
-- the claim. insert_token is the random token of the AdvanceEntities that
-- inserted the row, which tells it its own rows from the others'.
-- expires_at is the last advance plus the scope's retention (NULL: kept
-- for ever); Purge forgets a watermark past it, as it forgets a key. Times
-- are UTC.
CREATE TABLE IF NOT EXISTS {{.Watermarks}} (
    scope        VARCHAR(128) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    entity       VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    major        BIGINT       NOT NULL,
    minor        BIGINT       NOT NULL,
    insert_token BIGINT UNSIGNED NOT NULL,
    updated_at   DATETIME(6)  NOT NULL,
    expires_at   DATETIME(6)  NULL,
    PRIMARY KEY (scope, entity),
    KEY {{call .Name "watermarks_expires"}} (expires_at),
    CONSTRAINT {{call .Name "watermark_entity_len"}} CHECK (octet_length(entity) BETWEEN 1 AND 200)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = {{.Collation}}
