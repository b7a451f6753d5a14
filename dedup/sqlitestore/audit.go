package sqlitestore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/dedup"
)

// The audit log: the table <Table>_audit holds one row per action an
// operator executed through the idem command (dedup.Auditor).
func (s *Store) auditTable() string { return `"` + s.cfg.Table + `_audit"` }

// RecordAction appends a to the audit log, stamped by the database's clock.
func (a *Admin) RecordAction(ctx context.Context, act dedup.Action) error {
	if _, err := a.s.db.ExecContext(ctx, `INSERT INTO `+a.s.auditTable()+` (actor, kind, plan, outcome) VALUES (?, ?, ?, ?)`,
		act.Actor, act.Kind, string(act.Plan), act.Outcome); err != nil {
		return fmt.Errorf("sqlitestore: record action: %w", err)
	}
	return nil
}

// Actions lists the audit log, newest first.
func (a *Admin) Actions(ctx context.Context, limit int) ([]dedup.Action, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := a.s.db.QueryContext(ctx, `SELECT id, at, actor, kind, plan, outcome FROM `+a.s.auditTable()+` ORDER BY id DESC LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: actions: %w", err)
	}
	defer rows.Close()
	var out []dedup.Action
	for rows.Next() {
		var act dedup.Action
		var at int64
		var plan string
		if err := rows.Scan(&act.ID, &at, &act.Actor, &act.Kind, &plan, &act.Outcome); err != nil {
			return nil, fmt.Errorf("sqlitestore: actions: %w", err)
		}
		act.At, act.Plan = time.UnixMilli(at), []byte(plan)
		out = append(out, act)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlitestore: actions: %w", err)
	}
	return out, nil
}
