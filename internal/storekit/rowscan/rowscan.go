// Package rowscan reads the result sets that several stores return alike,
// from pgx.Rows and *sql.Rows both.
package rowscan

import "github.com/idemkit/idem/dedup"

// Rows is what pgx.Rows and *sql.Rows have in common.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// Epochs reads the result of a query of (scope, epoch, releasing) into
// dedup.EpochStore's map, and closes its rows: rowscan.Epochs(db.Query(…)).
func Epochs(rows Rows, err error) (map[string]dedup.Epoch, error) {
	if err != nil {
		return nil, err
	}
	defer closeRows(rows)
	out := make(map[string]dedup.Epoch)
	for rows.Next() {
		var scope string
		var e dedup.Epoch
		if err := rows.Scan(&scope, &e.N, &e.Releasing); err != nil {
			return nil, err
		}
		out[scope] = e
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// closeRows closes pgx.Rows (Close()) and *sql.Rows (Close() error) alike;
// an error of the latter is rows.Err's, read before.
func closeRows(rows Rows) {
	switch r := rows.(type) {
	case interface{ Close() }:
		r.Close()
	case interface{ Close() error }:
		_ = r.Close()
	}
}
