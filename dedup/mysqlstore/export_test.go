package mysqlstore

// UseUpsert makes s claim with INSERT … ON DUPLICATE KEY UPDATE instead of
// INSERT IGNORE, to measure the choice (BenchmarkClaimVariants).
func UseUpsert(s *Store) { s.variant = variantUpsert }
