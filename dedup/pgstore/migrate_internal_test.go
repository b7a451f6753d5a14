package pgstore

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

// TestSplitStatements: distributed mode runs the embedded migrations
// statement by statement. Each piece is one statement (no semicolon left
// inside), the pieces are the files' statements in order, and no literal
// holds "--" or ";" that the split would cut.
func TestSplitStatements(t *testing.T) {
	st, err := New(new(pgxpool.Pool), Config{Schema: "s", Table: "t", Distributed: true})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := st.migrations()
	if err != nil {
		t.Fatal(err)
	}
	want := map[int][]string{
		1: {"CREATE TABLE IF NOT EXISTS", "CREATE INDEX IF NOT EXISTS"},
		2: {"ALTER TABLE", "ALTER TABLE", "CREATE INDEX IF NOT EXISTS"},
		3: {"CREATE TABLE IF NOT EXISTS"},
		4: {"CREATE TABLE IF NOT EXISTS"},
		5: {"CREATE TABLE IF NOT EXISTS"},
		6: {"CREATE TABLE IF NOT EXISTS"},
		7: {"CREATE TABLE IF NOT EXISTS", "CREATE INDEX IF NOT EXISTS"},
		8: {"CREATE TABLE IF NOT EXISTS", "CREATE INDEX IF NOT EXISTS", "CREATE TABLE IF NOT EXISTS", "CREATE INDEX IF NOT EXISTS", "CREATE INDEX IF NOT EXISTS"},
		9: {"CREATE TABLE IF NOT EXISTS", "CREATE INDEX IF NOT EXISTS", "CREATE TABLE IF NOT EXISTS", "CREATE UNIQUE INDEX IF NOT EXISTS"},
	}
	for _, m := range ms {
		got := sqlmigrate.Split(m.SQL)
		w, ok := want[m.Version]
		if !ok {
			t.Fatalf("migration %s: add its statements to this test", m.Name)
		}
		if len(got) != len(w) {
			t.Fatalf("migration %s split into %d statements, want %d: %q", m.Name, len(got), len(w), got)
		}
		for i, stmt := range got {
			if !strings.HasPrefix(stmt, w[i]) || strings.Contains(stmt, ";") || strings.Contains(stmt, "--") {
				t.Errorf("migration %s statement %d: %q, want one statement starting %q", m.Name, i+1, stmt, w[i])
			}
		}
		if !strings.Contains(got[0], "shard") && m.Version == 1 {
			t.Errorf("distributed migration 1 has no shard column: %s", got[0])
		}
		if strings.Contains(got[0], "fillfactor") && (m.Version == 3 || m.Version == 9) {
			t.Errorf("distributed migration 3 sets a Postgres storage parameter: %s", got[0])
		}
	}
}
