-- The counter every lease token is drawn from (see requests.go), seeded
-- with the largest token stored: tokens only grow, also across a purge.
CREATE TABLE IF NOT EXISTS {{.Tokens}} (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL CHECK (last >= 0)
);
INSERT OR IGNORE INTO {{.Tokens}} (id, last) SELECT 1, coalesce(max(token), 0) FROM {{.Table}};
