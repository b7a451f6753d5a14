-- The counter the effect journal's fencing tokens are drawn from (see
-- journal.go): one row (migration 004), moved by every draw in the drawing
-- transaction, so that tokens only grow, also across a purge.
CREATE TABLE IF NOT EXISTS {{.Tokens}} (
    id   TINYINT UNSIGNED NOT NULL,
    last BIGINT           NOT NULL,
    PRIMARY KEY (id),
    CONSTRAINT {{call .Name "tokens_one"}} CHECK (id = 1)
) ENGINE = InnoDB
