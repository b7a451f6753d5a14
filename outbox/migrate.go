package outbox

import (
	"context"
	"embed"
	"fmt"

	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
	"github.com/idemkit/idem/internal/storekit/sqlmigrate/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations renders the embedded migrations for this outbox's tables.
func (o *Outbox) migrations() ([]sqlmigrate.Migration, error) {
	ms, err := sqlmigrate.Load(migrationFS, "migrations", struct {
		Table, Dead string
		Index       func(string) string
	}{
		Table: o.table,
		Dead:  o.dead,
		Index: pgmigrate.Index(o.cfg.Table),
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return ms, nil
}

// Migrate creates or upgrades the outbox's schema and tables. Like
// pgstore's, it is safe to run from many processes at once (a
// transaction-scoped advisory lock) and records the versions it applied in
// the schema's idem_schema_migrations, which pgstore shares.
func (o *Outbox) Migrate(ctx context.Context) error {
	ms, err := o.migrations()
	if err != nil {
		return err
	}
	if err := pgmigrate.Migrate(ctx, o.pool, o.cfg.Schema, o.cfg.Table, ms); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	return nil
}

// Check reports whether the tables are migrated to this version of the
// package; an error wraps dedup.ErrNotMigrated when they are not.
func (o *Outbox) Check(ctx context.Context) error {
	ms, err := o.migrations()
	if err != nil {
		return err
	}
	have, exists, err := pgmigrate.Version(ctx, o.pool, o.cfg.Schema, o.cfg.Table)
	if err != nil {
		return fmt.Errorf("outbox: check: %w", err)
	}
	return sqlmigrate.Check("outbox", o.table, exists, have, ms, "Outbox.Migrate first")
}
