package pgstore

import (
	"context"
	"fmt"

	"github.com/idemkit/idem/dedup"
)

// The audit log: the table <Table>_audit holds one row per action an
// operator executed through the idem command (dedup.Auditor), written by
// the command, never by the consumer.

// RecordAction appends a to the audit log, stamped by the database's clock.
func (a *Admin) RecordAction(ctx context.Context, act dedup.Action) error {
	if _, err := a.s.pool.Exec(ctx, `INSERT INTO `+a.s.audit+` (actor, kind, plan, outcome) VALUES ($1, $2, $3::jsonb, $4)`,
		act.Actor, act.Kind, string(act.Plan), act.Outcome); err != nil {
		return fmt.Errorf("pgstore: record action: %w", err)
	}
	return nil
}

// Actions lists the audit log, newest first.
func (a *Admin) Actions(ctx context.Context, limit int) ([]dedup.Action, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := a.s.pool.Query(ctx, `SELECT id, at, actor, kind, plan::text, outcome FROM `+a.s.audit+` ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: actions: %w", err)
	}
	defer rows.Close()
	var out []dedup.Action
	for rows.Next() {
		var act dedup.Action
		var plan string
		if err := rows.Scan(&act.ID, &act.At, &act.Actor, &act.Kind, &plan, &act.Outcome); err != nil {
			return nil, fmt.Errorf("pgstore: actions: %w", err)
		}
		act.Plan = []byte(plan)
		out = append(out, act)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: actions: %w", err)
	}
	return out, nil
}
