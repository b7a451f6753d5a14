package sqlmigrate_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

func TestLoadRendersAndSorts(t *testing.T) {
	fsys := fstest.MapFS{
		"m/010_later.sql":  {Data: []byte("ALTER TABLE {{.Table}} ADD x int;")},
		"m/002_index.sql":  {Data: []byte("CREATE INDEX {{call .Index \"i\"}} ON {{.Table}} (k);")},
		"m/001_create.sql": {Data: []byte("CREATE TABLE {{.Table}} (k int);")},
		"m/README":         {Data: []byte("not a migration")},
	}
	ms, err := sqlmigrate.Load(fsys, "m", struct {
		Table string
		Index func(string) string
	}{"t", func(s string) string { return "t_" + s }})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, m.Name+": "+m.SQL)
	}
	want := []string{"001_create.sql: CREATE TABLE t (k int);", "002_index.sql: CREATE INDEX t_i ON t (k);", "010_later.sql: ALTER TABLE t ADD x int;"}
	if !slices.Equal(got, want) || sqlmigrate.Latest(ms) != 10 {
		t.Fatalf("Load: %q (latest %d), want %q (latest 10)", got, sqlmigrate.Latest(ms), want)
	}
}

func TestLoadRefusesBadFiles(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"create.sql":                        {"m/create.sql": {Data: []byte("x")}},
		"two files with version 1":          {"m/001_a.sql": {Data: []byte("x")}, "m/001_b.sql": {Data: []byte("y")}},
		"missing field {{.Nope}}":           {"m/001_a.sql": {Data: []byte("{{.Nope}}")}},
		"no migrations in m":                {"other/001_a.sql": {Data: []byte("x")}},
		"template: 001_a.sql:1: unexpected": {"m/001_a.sql": {Data: []byte("{{")}},
	} {
		if _, err := sqlmigrate.Load(fsys, "m", struct{ Table string }{"t"}); err == nil {
			t.Errorf("%s: Load succeeded, want an error", name)
		}
	}
}

// session records what Run asks of it.
type session struct {
	applied []int
	ran     []string
	fail    string
}

func (s *session) Applied(context.Context, string) ([]int, error) { return s.applied, nil }
func (s *session) Apply(_ context.Context, _ string, m sqlmigrate.Migration) error {
	if m.Name == s.fail {
		return errors.New("boom")
	}
	s.ran = append(s.ran, m.Name)
	s.applied = append(s.applied, m.Version)
	return nil
}

func TestRunAppliesThePendingInOrder(t *testing.T) {
	ms := []sqlmigrate.Migration{{Version: 1, Name: "001"}, {Version: 2, Name: "002"}, {Version: 3, Name: "003"}}
	s := &session{applied: []int{2}}
	if err := sqlmigrate.Run(context.Background(), s, "t", ms); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.ran, []string{"001", "003"}) {
		t.Fatalf("ran %v, want 001 and 003", s.ran)
	}
	s = &session{fail: "002"}
	err := sqlmigrate.Run(context.Background(), s, "t", ms)
	if err == nil || !strings.Contains(err.Error(), "migration 002: boom") || !slices.Equal(s.ran, []string{"001"}) {
		t.Fatalf("Run with 002 failing: %v after %v, want it named and 003 not run", err, s.ran)
	}
}

func TestCheck(t *testing.T) {
	ms := []sqlmigrate.Migration{{Version: 1}, {Version: 2}}
	if err := sqlmigrate.Check("pkg", "t", true, 2, ms, "Migrate"); err != nil {
		t.Fatalf("Check of a migrated table: %v", err)
	}
	for _, c := range []struct {
		exists bool
		have   int
	}{{true, 1}, {false, 2}, {false, 0}} {
		err := sqlmigrate.Check("pkg", "t", c.exists, c.have, ms, "Store.Migrate before Run")
		if !errors.Is(err, dedup.ErrNotMigrated) || !strings.Contains(err.Error(), "call Store.Migrate before Run") {
			t.Errorf("Check(exists %v, at %d): %v, want ErrNotMigrated naming what to call", c.exists, c.have, err)
		}
	}
}

func TestSplit(t *testing.T) {
	got := sqlmigrate.Split("-- a comment; with a semicolon\nCREATE TABLE t (k int); -- trailing\n\nCREATE INDEX i ON t (k);\n")
	want := []string{"CREATE TABLE t (k int)", "CREATE INDEX i ON t (k)"}
	if !slices.Equal(got, want) {
		t.Fatalf("Split: %q, want %q", got, want)
	}
}
