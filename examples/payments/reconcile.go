package payments

import (
	"context"
	"fmt"
	"strings"
)

// Report is the outcome of Reconcile. Every count but the totals must be 0.
type Report struct {
	Payments        int64 // ledger rows
	Credited        int64 // sum of balances
	Lost            int64 // expected payments with no ledger row or an unpaid order
	DoubleApplied   int64 // accounts whose balance differs from their ledger sum, plus SKUs whose sales differ from their paid orders
	Unexpected      int64 // ledger rows nobody expected (wrong amount, unknown txn)
	LedgerNoDedup   int64 // ledger rows without a committed dedup row
	DedupNoLedger   int64 // committed dedup rows without a ledger row
	PaidNoLedger    int64 // PAID orders without their ledger row
	LedgerNotPaid   int64 // ledger rows whose order is not PAID by that transaction
	Problems        []string
	ExpectedPayment int
}

// OK reports whether the four tables agree.
func (r Report) OK() bool { return len(r.Problems) == 0 }

func (r Report) String() string {
	if r.OK() {
		return fmt.Sprintf("reconciled: %d payments, %d credited", r.Payments, r.Credited)
	}
	return "NOT reconciled: " + strings.Join(r.Problems, "; ")
}

// Expected is a payment the producer sent and expects applied once.
type Expected struct {
	TxnID  string
	Amount int64
	// Channel, when set, is the channel that sent it: two channels may
	// send the same transaction number. Empty: any channel.
	Channel string
}

// Reconcile cross-checks orders, ledger, accounts, inventory and idem's dedup
// table (dedupTable, schema-qualified and quoted as the store names it,
// holding the keys of scope). expected lists every valid payment sent.
func Reconcile(ctx context.Context, db DB, dedupTable, scope string, expected []Expected) (Report, error) {
	var r Report
	r.ExpectedPayment = len(expected)
	q := func(dst *int64, sql string, args ...any) error {
		if err := db.QueryRow(ctx, sql, args...).Scan(dst); err != nil {
			return fmt.Errorf("payments: reconcile: %w", err)
		}
		return nil
	}
	if err := q(&r.Payments, `SELECT count(*) FROM ledger`); err != nil {
		return r, err
	}
	if err := q(&r.Credited, `SELECT coalesce(sum(balance), 0) FROM accounts`); err != nil {
		return r, err
	}
	seen := make(map[Expected]bool, len(expected))
	for _, e := range expected {
		id := Expected{TxnID: e.TxnID, Channel: e.Channel}
		if seen[id] {
			return r, fmt.Errorf("payments: reconcile: %s is expected twice (channel %q)", e.TxnID, e.Channel)
		}
		seen[id] = true
		var n int64
		if err := q(&n, `SELECT count(*) FROM ledger l JOIN orders o ON o.id = l.order_id
WHERE l.txn_id = $1 AND l.amount = $2 AND o.status = 'PAID' AND o.paid_txn = l.txn_id
    AND ($3 = '' OR l.channel = $3)`, e.TxnID, e.Amount, e.Channel); err != nil {
			return r, err
		}
		if n != 1 {
			r.Lost++
		}
	}
	r.Unexpected = r.Payments - (int64(len(expected)) - r.Lost)
	if err := RunCounts(ctx, db, []Count{
		{&r.DoubleApplied, `SELECT (SELECT count(*) FROM accounts a
        WHERE a.balance <> (SELECT coalesce(sum(l.amount), 0) FROM ledger l WHERE l.account_id = a.id))
     + (SELECT count(*) FROM inventory i
        WHERE i.sold <> (SELECT count(*) FROM orders o WHERE o.sku = i.sku AND o.status = 'PAID'))`, nil},
		{&r.LedgerNoDedup, `SELECT count(*) FROM ledger l WHERE NOT EXISTS
    (SELECT 1 FROM ` + dedupTable + ` d WHERE d.scope = $1 AND d.key = l.txn_id AND d.outcome = 'done')`, []any{scope}},
		{&r.DedupNoLedger, `SELECT count(*) FROM ` + dedupTable + ` d WHERE d.scope = $1 AND d.outcome = 'done'
    AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.txn_id = d.key)`, []any{scope}},
		{&r.PaidNoLedger, `SELECT count(*) FROM orders o WHERE o.status = 'PAID'
    AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.txn_id = o.paid_txn AND l.order_id = o.id)`, nil},
		{&r.LedgerNotPaid, `SELECT count(*) FROM ledger l JOIN orders o ON o.id = l.order_id
    WHERE o.status <> 'PAID' OR o.paid_txn IS NULL OR o.paid_txn <> l.txn_id`, nil},
	}); err != nil {
		return r, fmt.Errorf("payments: reconcile: %w", err)
	}
	r.Problems = ListProblems(
		Problem{r.Lost, "lost payments"},
		Problem{r.DoubleApplied, "accounts or SKUs that disagree with the ledger (double effect)"},
		Problem{r.Unexpected, "unexpected ledger rows"},
		Problem{r.LedgerNoDedup, "ledger rows without a dedup row"},
		Problem{r.DedupNoLedger, "dedup rows without a ledger row"},
		Problem{r.PaidNoLedger, "paid orders without a ledger row"},
		Problem{r.LedgerNotPaid, "ledger rows whose order is not paid by them"},
	)
	return r, nil
}

// A Count is one query of a reconciliation: SQL, with Args, counts into N.
type Count struct {
	N    *int64
	SQL  string
	Args []any
}

// RunCounts runs each count on db, in order, and returns the first error
// as the database gave it.
func RunCounts(ctx context.Context, db DB, counts []Count) error {
	for _, c := range counts {
		if err := db.QueryRow(ctx, c.SQL, c.Args...).Scan(c.N); err != nil {
			return err
		}
	}
	return nil
}

// A Problem is a count that must be 0, and what it counts.
type Problem struct {
	N    int64
	What string
}

// ListProblems says "N What" for each problem whose count is not 0, in
// order; nil when there is none.
func ListProblems(ps ...Problem) []string {
	var out []string
	for _, p := range ps {
		if p.N != 0 {
			out = append(out, fmt.Sprintf("%d %s", p.N, p.What))
		}
	}
	return out
}
