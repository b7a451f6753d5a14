-- Release epochs (dedup.EpochStore): per scope, a counter moved forward
-- around every release of the scope's keys, and the release in progress,
-- if any, with the time its hold runs out. A cache in front of the store
-- (dedup/redisfront) tags its entries with the epoch and trusts them only
-- while it has not moved, so that no entry written before a release is
-- believed after it, whatever happened to the cache.
CREATE TABLE IF NOT EXISTS {{.Epochs}} (
    scope         text        NOT NULL PRIMARY KEY CHECK (octet_length(scope) BETWEEN 1 AND 128),
    epoch         bigint      NOT NULL CHECK (epoch > 0),
    release_token bigint,
    release_until timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
