-- Admin.Lock's rows in distributed mode, which has no advisory locks: a
-- lock is its row, held FOR UPDATE by an open transaction.
CREATE TABLE IF NOT EXISTS {{.Locks}} (
    name text PRIMARY KEY
);
