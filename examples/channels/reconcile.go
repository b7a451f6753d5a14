package channels

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/idemkit/idem/examples/payments"
)

// Report is the outcome of Reconcile: OK when it has no problem.
type Report struct {
	Events, Applied, Recorded int64 // channel_events rows
	Stale                     int64 // the store's stale records of the scope
	Problems                  []string
}

// OK reports whether the tables hold exactly the expected end state.
func (r Report) OK() bool { return len(r.Problems) == 0 }

func (r Report) String() string {
	if r.OK() {
		return fmt.Sprintf("reconciled: %d events (%d applied, %d recorded), %d stale", r.Events, r.Applied, r.Recorded, r.Stale)
	}
	return "NOT reconciled: " + strings.Join(r.Problems, "; ")
}

// Reconcile checks the tables against want: every order's status, paying
// trade, partial refunds and transitions in order; balances and units sold; every ledger row
// explained by an order and every order's money in the ledger; the events
// recorded; and, when dedupTable is set (as the store names it), that the
// committed dedup keys of scope are the recorded events and the stale ones
// the store recorded in staleTable, as many as want says.
func Reconcile(ctx context.Context, db payments.DB, dedupTable, staleTable, scope string, want Expected) (Report, error) {
	var r Report
	problem := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }
	count := func(sql string, args ...any) (int64, error) {
		var n int64
		if err := db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			return 0, fmt.Errorf("channels: reconcile: %w", err)
		}
		return n, nil
	}

	var orders int64
	for _, o := range want.Orders {
		var status, paid, transitions string
		var refunded int64
		err := db.QueryRow(ctx, `SELECT status, coalesce(paid_txn, ''), refunded,
    coalesce((SELECT string_agg(e.from_status || '>' || e.to_status, ' ' ORDER BY e.seq)
              FROM channel_events e WHERE e.order_id = o.id AND e.effect = 'applied'), '')
FROM orders o WHERE id = $1`, o.ID).Scan(&status, &paid, &refunded, &transitions)
		if err != nil {
			return r, fmt.Errorf("channels: reconcile: order %s: %w", o.ID, err)
		}
		orders++
		if status != o.Status || paid != o.PaidTxn {
			problem("order %s is %s paid by %q, want %s by %q", o.ID, status, paid, o.Status, o.PaidTxn)
		}
		if refunded != o.Refunded {
			problem("order %s has %d refunded in part, want %d", o.ID, refunded, o.Refunded)
		}
		if got := strings.Fields(transitions); !slices.Equal(got, o.Transitions) {
			problem("order %s moved %v, want %v", o.ID, got, o.Transitions)
		}
	}
	if n, err := count(`SELECT count(*) FROM orders`); err != nil {
		return r, err
	} else if n != orders {
		problem("%d orders, want %d", n, orders)
	}

	for id, v := range want.Balances {
		if got, err := count(`SELECT balance FROM accounts WHERE id = $1`, id); err != nil {
			return r, err
		} else if got != v {
			problem("balance of %s is %d, want %d", id, got, v)
		}
	}
	for sku, v := range want.Sold {
		if got, err := count(`SELECT sold FROM inventory WHERE sku = $1`, sku); err != nil {
			return r, err
		} else if got != v {
			problem("units sold of %s is %d, want %d", sku, got, v)
		}
	}

	checks := []struct{ what, sql string }{
		{"accounts whose balance is not their ledger's sum", `SELECT count(*) FROM accounts a
    WHERE a.balance <> (SELECT coalesce(sum(l.amount), 0) FROM ledger l WHERE l.account_id = a.id)`},
		{"paid orders without their payment in the ledger", `SELECT count(*) FROM orders o WHERE o.status <> 'UNPAID'
    AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.txn_id = o.paid_txn AND l.order_id = o.id AND l.amount = o.amount)`},
		{"refunded orders without their refund in the ledger", `SELECT count(*) FROM orders o WHERE o.status = 'REFUNDED'
    AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.txn_id = o.paid_txn || '/refund' AND l.order_id = o.id AND l.amount = -o.amount)`},
		{"ledger rows no order explains", `SELECT count(*) FROM ledger l LEFT JOIN orders o ON o.id = l.order_id
    WHERE o.id IS NULL OR NOT ((l.txn_id = o.paid_txn AND l.amount = o.amount AND o.status <> 'UNPAID')
                            OR (l.txn_id = o.paid_txn || '/refund' AND l.amount = -o.amount AND o.status = 'REFUNDED')
                            OR (starts_with(l.txn_id, o.paid_txn || '/refund/') AND l.amount < 0 AND o.status = 'PAID'))`},
		{"orders whose partial refunds are not their ledger's", `SELECT count(*) FROM orders o WHERE o.refunded <>
    (SELECT coalesce(-sum(l.amount), 0) FROM ledger l WHERE l.order_id = o.id AND starts_with(l.txn_id, o.paid_txn || '/refund/'))`},
	}
	for _, c := range checks {
		if n, err := count(c.sql); err != nil {
			return r, err
		} else if n != 0 {
			problem("%d %s", n, c.what)
		}
	}

	err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE effect = 'applied'), count(*) FILTER (WHERE effect = 'recorded')
FROM channel_events`).Scan(&r.Events, &r.Applied, &r.Recorded)
	if err != nil {
		return r, fmt.Errorf("channels: reconcile: %w", err)
	}
	if w := want.Fields; r.Events != int64(w.Events) || r.Applied != int64(w.Applied) || r.Recorded != int64(w.Recorded) {
		problem("%d events recorded (%d applied, %d recorded), want %d (%d, %d)", r.Events, r.Applied, r.Recorded, w.Events, w.Applied, w.Recorded)
	}
	if dedupTable != "" {
		for what, sql := range map[string]string{
			"committed dedup keys without their event": `SELECT count(*) FROM ` + dedupTable + ` d WHERE d.scope = $1 AND d.outcome = 'done'
    AND NOT EXISTS (SELECT 1 FROM channel_events e WHERE e.event_key = d.key)
    AND NOT EXISTS (SELECT 1 FROM ` + staleTable + ` s WHERE s.scope = $1 AND s.key = d.key)`,
			"stale events that were applied": `SELECT count(*) FROM ` + staleTable + ` s WHERE s.scope = $1
    AND EXISTS (SELECT 1 FROM channel_events e WHERE e.event_key = s.key)`,
			"events without a committed dedup key": `SELECT count(*) FROM channel_events e WHERE NOT EXISTS
    (SELECT 1 FROM ` + dedupTable + ` d WHERE d.scope = $1 AND d.key = e.event_key AND d.outcome = 'done')`,
		} {
			if n, err := count(sql, scope); err != nil {
				return r, err
			} else if n != 0 {
				problem("%d %s", n, what)
			}
		}
	}
	if dedupTable != "" {
		if r.Stale, err = count(`SELECT count(*) FROM `+staleTable+` WHERE scope = $1`, scope); err != nil {
			return r, err
		}
		if r.Stale != int64(want.Fields.Stale) {
			problem("%d stale events recorded, want %d", r.Stale, want.Fields.Stale)
		}
	}
	slices.Sort(r.Problems) // map order
	return r, nil
}
