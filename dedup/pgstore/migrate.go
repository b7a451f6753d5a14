package pgstore

import (
	"context"
	"embed"
	"fmt"

	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
	"github.com/idemkit/idem/internal/storekit/sqlmigrate/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations renders the embedded migrations for this store's table.
func (s *Store) migrations() ([]sqlmigrate.Migration, error) {
	ms, err := sqlmigrate.Load(migrationFS, "migrations", struct {
		Table       string
		Offsets     string
		Epochs      string
		Audit       string
		Locks       string
		Steps       string
		Watermarks  string
		Stale       string
		ParkedKeys  string
		Parked      string
		Distributed bool
		Partitioned bool
		Index       func(string) string
	}{
		Table:       s.table,
		Offsets:     s.offsets,
		Epochs:      s.epochs,
		Audit:       s.audit,
		Locks:       s.locks,
		Steps:       s.stepTab,
		Watermarks:  s.marksTab,
		Stale:       s.staleTab,
		ParkedKeys:  s.parkKeysTab,
		Parked:      s.parkedTab,
		Distributed: s.cfg.Distributed,
		Partitioned: s.part != nil,
		Index:       pgmigrate.Index(s.cfg.Table),
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: %w", err)
	}
	return ms, nil
}

// Migrate creates or upgrades the store's schema and table. It is safe to run
// from many processes at once: it holds a transaction-scoped advisory lock and
// records applied versions per table in idem_schema_migrations. In
// distributed mode it holds a lock row with a lease instead and runs one DDL
// statement per transaction (internal/storekit/sqlmigrate/pgmigrate), then checks
// that the table has the distributed mode's shard column.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := s.migrations()
	if err != nil {
		return err
	}
	if !s.cfg.Distributed {
		if err := pgmigrate.Migrate(ctx, s.pool, s.cfg.Schema, s.cfg.Table, ms); err != nil {
			return fmt.Errorf("pgstore: %w", err)
		}
		return s.afterMigrate(ctx) // partitions.go
	}
	if err := pgmigrate.MigrateDistributed(ctx, s.pool, s.cfg.Schema, s.cfg.Table, ms); err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	var sharded bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 AND column_name = 'shard')`,
		s.cfg.Schema, s.cfg.Table).Scan(&sharded); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	if !sharded {
		return s.mismatch(false)
	}
	return nil
}
