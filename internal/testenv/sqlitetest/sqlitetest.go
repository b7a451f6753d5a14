// Package sqlitetest builds sqlitestore's stores for tests of what stands
// on them, as pgtest does pgstore's.
package sqlitetest

import (
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv"
)

// Open opens a database in a file of the test's temporary directory
// (closed when the test ends) and returns a sqlitestore.Store on it, not
// migrated, and the database; cfg is given to both Open and New. It fails
// the test on an error.
func Open(t testing.TB, cfg sqlitestore.Config) (*sqlitestore.Store, *sql.DB) {
	t.Helper()
	db, err := sqlitestore.Open(filepath.Join(t.TempDir(), "idem.db"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := sqlitestore.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st, db
}

// Store is Open with the store migrated.
func Store(t testing.TB, cfg sqlitestore.Config) (*sqlitestore.Store, *sql.DB) {
	t.Helper()
	st, db := Open(t, cfg)
	if err := st.Migrate(testenv.Context(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	return st, db
}
