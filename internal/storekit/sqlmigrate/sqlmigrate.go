// Package sqlmigrate is idem's one migration runner. A store (or the
// outbox) embeds its migrations as versioned SQL files, NNN_name.sql,
// rendered as text/templates for its table; Run applies the ones not yet
// recorded, in order, through a dialect's Session, which holds the
// dialect's migration lock and records each version applied per table in
// idem_schema_migrations beside the table. The dialects: MySQL (GET_LOCK)
// and SQLite (the IMMEDIATE transaction's write lock) here, Postgres
// (an advisory lock, or a lock row with a lease in distributed mode) in
// pgmigrate. Check is what a store's Check says when its table is behind.
package sqlmigrate

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/idemkit/idem/dedup"
)

// Versions is the table of applied migrations, one per schema (Postgres),
// database (MySQL) or file (SQLite), shared by every table there: a row
// per (table_name, version).
const Versions = "idem_schema_migrations"

// Migration is one rendered migration.
type Migration struct {
	Version int
	Name    string // the file's name: 001_create_table.sql
	SQL     string
}

// Load reads the files *.sql of dir in fsys, each named NNN_name.sql, and
// renders each as a text/template with data. The result is sorted by
// version; a file without a version prefix, two files with one version
// or a template that fails is an error naming the file.
func Load(fsys fs.FS, dir string, data any) ([]Migration, error) {
	entries, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		base := path.Base(e)
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: no version prefix (want NNN_name.sql)", base)
		}
		raw, err := fs.ReadFile(fsys, e)
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(base).Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", base, err)
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, data); err != nil {
			return nil, fmt.Errorf("migration %s: %w", base, err)
		}
		ms = append(ms, Migration{Version: v, Name: base, SQL: buf.String()})
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("migrations %s and %s have one version", ms[i-1].Name, ms[i].Name)
		}
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("no migrations in %s", dir)
	}
	return ms, nil
}

// Latest is the version a table migrated to the end of ms is at.
func Latest(ms []Migration) int {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// A Session is a dialect's hold on the database while it migrates: its
// migration lock is taken, and what it applies is recorded.
type Session interface {
	// Applied returns the versions recorded for table.
	Applied(ctx context.Context, table string) ([]int, error)
	// Apply runs m and records its version for table.
	Apply(ctx context.Context, table string, m Migration) error
}

// Run applies, in order, the migrations of ms that s has not recorded for
// table. A migration's error names it.
func Run(ctx context.Context, s Session, table string, ms []Migration) error {
	applied, err := s.Applied(ctx, table)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, m := range ms {
		if slices.Contains(applied, m.Version) {
			continue
		}
		if err := s.Apply(ctx, table, m); err != nil {
			return fmt.Errorf("migration %s: %w", m.Name, err)
		}
	}
	return nil
}

// Check is a store's verdict on a table whose recorded version is have and
// which exists or not: nil when it is migrated to the end of ms, otherwise
// an error wrapping dedup.ErrNotMigrated that names the table and what to
// call ("Store.Migrate before Run"). pkg prefixes the message.
func Check(pkg, table string, exists bool, have int, ms []Migration, call string) error {
	if want := Latest(ms); !exists || have < want {
		return fmt.Errorf("%w: %s: table %s is at migration %d of %d: call %s", dedup.ErrNotMigrated, pkg, table, have, want, call)
	}
	return nil
}

// Split splits a migration into its statements: comments removed, split
// at semicolons, for a dialect that runs one statement at a time. The
// migrations split so hold no semicolon nor "--" inside a literal.
func Split(sql string) []string {
	var b strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	var out []string
	for _, stmt := range strings.Split(b.String(), ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			out = append(out, stmt)
		}
	}
	return out
}
