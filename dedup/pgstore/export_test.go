package pgstore

// Shards is shardCount, for the tests of distributed mode.
const Shards = shardCount
