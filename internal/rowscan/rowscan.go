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

// Epochs reads rows of (scope, epoch, releasing) into dedup.EpochStore's
// map. The caller closes rows.
func Epochs(rows Rows) (map[string]dedup.Epoch, error) {
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
