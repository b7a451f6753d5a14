-- The stale events of the entity watermarks: an event at or below its
-- entity's watermark, with the message's key, both versions and when it
-- was recorded, in the transaction of the claim; purged past the scope's
-- retention. Times are UTC.
CREATE TABLE IF NOT EXISTS {{.Stale}} (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    scope      VARCHAR(128) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    `key`      VARCHAR(256) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    entity     VARCHAR(200) CHARACTER SET utf8mb4 COLLATE {{.Collation}} NOT NULL,
    major      BIGINT       NOT NULL,
    minor      BIGINT       NOT NULL,
    mark_major BIGINT       NOT NULL,
    mark_minor BIGINT       NOT NULL,
    at         DATETIME(6)  NOT NULL,
    expires_at DATETIME(6)  NULL,
    PRIMARY KEY (id),
    KEY {{call .Name "stale_entity"}} (scope, entity),
    KEY {{call .Name "stale_expires"}} (expires_at)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = {{.Collation}}
