// Package pgtest builds pgstore's stores for tests of what stands on them.
// It is apart from testenv because pgstore's own tests use testenv.
package pgtest

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// Store is a pgstore.Store with its table in schema (as testenv.SchemaPool
// returns it), migrated. It fails the test on an error.
func Store(t testing.TB, pool *pgxpool.Pool, schema string) *pgstore.Store {
	t.Helper()
	store, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(testenv.Context(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	return store
}
