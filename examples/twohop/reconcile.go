package twohop

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/outbox"
)

// DB is what Reconcile needs: a *pgxpool.Pool or *pgx.Conn whose
// search_path holds the tables.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Report is the outcome of Reconcile. Every count but Shipped must be 0.
type Report struct {
	Payments payments.Report // the first hop

	Shipped         int64 // shipment rows
	Unshipped       int64 // paid orders without a shipment: a lost event
	ShippedTwice    int64 // orders with more than one shipment: a double effect
	ShippedUnpaid   int64 // shipments of orders not paid by the shipment's transaction
	WrongEvent      int64 // shipments not made by the event MessageID({payments, txn}, 0)
	Warehouse       int64 // SKUs whose shipped count differs from their shipments or from their sales
	ShipmentNoDedup int64 // shipments without a committed shipping dedup row under their event
	DedupNoShipment int64 // committed shipping dedup rows without a shipment
	OutboxPending   int64 // events not published yet
	OutboxDead      int64 // events the broker refused
	Problems        []string
}

// OK reports whether both hops agree.
func (r Report) OK() bool { return r.Payments.OK() && len(r.Problems) == 0 }

func (r Report) String() string {
	if r.OK() {
		return fmt.Sprintf("%s; shipped %d, each paid order once", r.Payments, r.Shipped)
	}
	return fmt.Sprintf("%s; second hop: %s", r.Payments, strings.Join(r.Problems, "; "))
}

// Reconcile checks both hops once everything has been consumed: the
// payments tables (payments.Reconcile, scope PaymentsName), then every paid
// order shipped once by its payment's event, the shipping dedup rows (scope
// ShippingName) against the shipments, and an empty outbox. dedupTable is
// the dedup table as pgstore names it (Store.Table).
func Reconcile(ctx context.Context, db DB, dedupTable string, ob *outbox.Outbox, expected []payments.Expected) (Report, error) {
	var r Report
	var err error
	if r.Payments, err = payments.Reconcile(ctx, payments.Pgx(db), dedupTable, PaymentsName, expected); err != nil {
		return r, err
	}
	if err := payments.RunCounts(ctx, payments.Pgx(db), []payments.Count{
		{N: &r.Shipped, SQL: `SELECT count(*) FROM shipments`},
		{N: &r.Unshipped, SQL: `SELECT count(*) FROM orders o WHERE o.status = 'PAID' AND NOT EXISTS (SELECT 1 FROM shipments s WHERE s.order_id = o.id)`},
		{N: &r.ShippedTwice, SQL: `SELECT count(*) FROM (SELECT order_id FROM shipments GROUP BY order_id HAVING count(*) > 1) x`},
		{N: &r.ShippedUnpaid, SQL: `SELECT count(*) FROM shipments s LEFT JOIN orders o ON o.id = s.order_id
    WHERE o.id IS NULL OR o.status <> 'PAID' OR o.paid_txn IS DISTINCT FROM s.txn_id`},
		{N: &r.Warehouse, SQL: `SELECT count(*) FROM (
    SELECT coalesce(w.sku, s.sku, i.sku) AS sku, coalesce(w.shipped, 0) AS w, coalesce(s.n, 0) AS s, coalesce(i.sold, 0) AS i
    FROM warehouse w
    FULL JOIN (SELECT sku, count(*) AS n FROM shipments GROUP BY sku) s ON s.sku = w.sku
    FULL JOIN inventory i ON i.sku = coalesce(w.sku, s.sku)) x WHERE x.w <> x.s OR x.w <> x.i`},
		{N: &r.ShipmentNoDedup, SQL: `SELECT count(*) FROM shipments s WHERE NOT EXISTS
    (SELECT 1 FROM ` + dedupTable + ` d WHERE d.scope = $1 AND d.key = s.event_id AND d.outcome = 'done')`, Args: []any{ShippingName}},
		{N: &r.DedupNoShipment, SQL: `SELECT count(*) FROM ` + dedupTable + ` d WHERE d.scope = $1 AND d.outcome = 'done'
    AND NOT EXISTS (SELECT 1 FROM shipments s WHERE s.event_id = d.key)`, Args: []any{ShippingName}},
		{N: &r.OutboxPending, SQL: `SELECT count(*) FROM ` + ob.Table() + ` WHERE sent_at IS NULL`},
		{N: &r.OutboxDead, SQL: `SELECT count(*) FROM ` + ob.DeadTable()},
	}); err != nil {
		return r, fmt.Errorf("twohop: reconcile: %w", err)
	}
	// Identity flows forward: each shipment was made by the event its
	// payment's key names.
	rows, err := db.Query(ctx, `SELECT txn_id, event_id FROM shipments`)
	if err != nil {
		return r, fmt.Errorf("twohop: reconcile: %w", err)
	}
	for rows.Next() {
		var txn, event string
		if err := rows.Scan(&txn, &event); err != nil {
			rows.Close()
			return r, fmt.Errorf("twohop: reconcile: %w", err)
		}
		if event != outbox.MessageID(dedup.Key{Scope: PaymentsName, ID: txn}, 0) {
			r.WrongEvent++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("twohop: reconcile: %w", err)
	}
	r.Problems = payments.ListProblems(
		payments.Problem{N: r.Unshipped, What: "paid orders not shipped (lost events)"},
		payments.Problem{N: r.ShippedTwice, What: "orders shipped more than once (double effect)"},
		payments.Problem{N: r.ShippedUnpaid, What: "shipments of orders not paid by them"},
		payments.Problem{N: r.WrongEvent, What: "shipments not made by their payment's event"},
		payments.Problem{N: r.Warehouse, What: "SKUs whose warehouse count disagrees with shipments or sales"},
		payments.Problem{N: r.ShipmentNoDedup, What: "shipments without a shipping dedup row"},
		payments.Problem{N: r.DedupNoShipment, What: "shipping dedup rows without a shipment"},
		payments.Problem{N: r.OutboxPending, What: "events still in the outbox"},
		payments.Problem{N: r.OutboxDead, What: "events refused by the broker"},
	)
	return r, nil
}
