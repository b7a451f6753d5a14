-- The counter's one row, made here rather than by the first draw: two
-- first draws inserting it at once would deadlock on its duplicate.
INSERT IGNORE INTO {{.Tokens}} (id, last) VALUES (1, 0)
