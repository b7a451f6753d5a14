package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/httpidem"
)

// Route is the callback endpoint's pattern; {channel} is the tenant.
const Route = "POST /callbacks/{channel}"

// Retention keeps a callback's key and answer for a week: a channel re-sends
// a callback it saw no success for over about 25 hours.
const Retention = 7 * 24 * time.Hour

// Options are the webhook's settings besides its store.
type Options struct {
	Logger *slog.Logger
	// Halfway, when set, runs in the handler's transaction (tx is its
	// TTx) after the payment was booked and before the answer: tests
	// inject their failures there (a dropped connection, a panic).
	Halfway func(ctx context.Context, tx any) error
	// Bank is the fake bank's base URL (http://host:port), where payouts
	// go; empty: no /payouts route.
	Bank string
	// Lease is the payouts' lease (httpidem.Route.Lease); default 30s.
	Lease time.Duration
	// Hold is what "Demo-Fault: slow" does; default: wait 3 seconds.
	Hold func(ctx context.Context) error
	// Crash is what "Demo-Fault: crash" does (the program's is Kill); nil:
	// the knob is refused with 400.
	Crash func()
}

// DefaultHold is how long "Demo-Fault: slow" holds a request by default:
// long enough to send a duplicate meanwhile.
const DefaultHold = 3 * time.Second

// wait waits d, or until ctx ends.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// answer is what a payment channel expects back: SUCCESS stops its
// re-sends; FAIL, with a 4xx, tells it the callback was refused.
type answer struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func reply(w http.ResponseWriter, status int, code, message string) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(answer{Code: code, Message: message})
}

// Handler serves the webhook's two routes, one per mode of httpidem.
//
// POST /callbacks/{channel} is the payment-channel callback endpoint,
// transactional: a payments.Callback as JSON with the channel's
// transaction number as the Idempotency-Key. Each callback is booked into
// the payments tables (order, ledger, balance, inventory) once, in the
// transaction that stores the key and the answer: a re-sent callback gets
// the first answer again, byte for byte, with Idempotent-Replayed: true.
// The channel is the tenant: two channels' transaction numbers never meet.
// The fingerprint is the callback's fields that define the payment, not its
// spelling: a channel re-sending it reformatted is a replay, the same
// transaction number with another amount is refused with 422.
//
// POST /payouts (when opts.Bank is set) is leased: a payout
// {"account":…,"amount":…} made at the bank, outside the database. The
// key is committed as Processing under a lease before the handler runs;
// the bank gets the key and the lease's fencing token (see payouts).
//
// Both honour the FaultHeader knob.
func Handler[TTx any](st dedup.RequestStore[TTx], db func(TTx) payments.DB, opts Options) (http.Handler, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Hold == nil {
		opts.Hold = func(ctx context.Context) error { return wait(ctx, DefaultHold) }
	}
	idem, err := httpidem.New(httpidem.Config[TTx]{
		Store:  st,
		Tenant: func(r *http.Request) (string, error) { return r.PathValue("channel"), nil }, // none on /payouts
		Logger: opts.Logger,
	})
	if err != nil {
		return nil, err
	}
	route := httpidem.Route{
		Fingerprint:     httpidem.JSONFields(payments.KeyField, "order_id", "amount", "channel", "status"),
		Retention:       Retention,
		MaxRequestBytes: payments.MaxPayload,
	}
	mux := http.NewServeMux()
	mux.Handle(Route, withFaults(idem.Transactional(route, callbacks(db, opts)), opts))
	if opts.Bank != "" {
		mux.Handle(PayoutRoute, withFaults(idem.Leased(httpidem.Route{Lease: opts.Lease})(payouts(newBankClient(opts.Bank), opts)), opts))
	}
	return mux, nil
}

// callbacks is the transactional handler: it books a callback in tx.
func callbacks[TTx any](db func(TTx) payments.DB, opts Options) httpidem.TxHandlerFunc[TTx] {
	return func(w http.ResponseWriter, r *http.Request, tx TTx) error {
		key, _ := httpidem.KeyFrom(r.Context()) // decoded: "42" and 42 are one key
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		cb, err := payments.Decode(body)
		switch {
		case err != nil:
			// Stored like any answer: the same callback is refused
			// the same way, without running again.
			return reply(w, http.StatusBadRequest, "FAIL", err.Error())
		case cb.Channel != r.PathValue("channel"):
			return reply(w, http.StatusBadRequest, "FAIL", fmt.Sprintf("channel %q posted to the endpoint of %q", cb.Channel, r.PathValue("channel")))
		case cb.TxnID != key:
			return reply(w, http.StatusBadRequest, "FAIL", "the Idempotency-Key must be the callback's txn_id")
		case fault(r) == fault5xx:
			// An answer like any other: stored with the key and replayed
			// to every re-send, and the callback is never booked. Return
			// an error instead to have the channel's retry run again.
			return reply(w, http.StatusInternalServerError, "FAIL", FaultHeader+": 5xx")
		}
		err = payments.Apply(r.Context(), db(tx), cb)
		if errors.Is(err, payments.ErrBadCallback) {
			// Nothing was written (Apply's conditional UPDATE matched
			// no order): refuse, and keep refusing.
			return reply(w, http.StatusBadRequest, "FAIL", err.Error())
		}
		if err != nil {
			return err // rolled back, nothing stored: the channel's retry books it
		}
		if opts.Halfway != nil {
			if err := opts.Halfway(r.Context(), tx); err != nil {
				return err
			}
		}
		switch fault(r) {
		case faultSlow:
			if err := opts.Hold(r.Context()); err != nil {
				return err
			}
		case faultError:
			return errors.New(FaultHeader + ": error after booking") // rolled back, nothing stored
		case faultPanic:
			panic(FaultHeader + ": panic after booking") // rolled back, nothing stored
		case faultCrash:
			opts.Crash() // the transaction never commits
		}
		return reply(w, http.StatusOK, "SUCCESS", "booked "+cb.TxnID)
	}
}

// Orders are the demo orders the webhook starts with, so that the
// curl lines of docs/http.md have something to pay.
var Orders = []payments.Order{
	{ID: "O-1001", Account: "merchant-01", SKU: "sku-001", Amount: 2500},
	{ID: "O-1002", Account: "merchant-01", SKU: "sku-002", Amount: 990},
	{ID: "O-1003", Account: "merchant-02", SKU: "sku-001", Amount: 12000},
	{ID: "O-1004", Account: "merchant-02", SKU: "sku-002", Amount: 4500},
	{ID: "O-1005", Account: "merchant-01", SKU: "sku-001", Amount: 800},
}

// Setup creates the payments tables and the demo orders missing from them.
func Setup(ctx context.Context, db payments.DB) error {
	if err := payments.Setup(ctx, db); err != nil {
		return err
	}
	for _, o := range Orders {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = $1`, o.ID).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if err := payments.CreateOrders(ctx, db, []payments.Order{o}); err != nil {
			return err
		}
	}
	return nil
}

// Reconcile cross-checks the payments tables with the keys the webhook
// answered SUCCESS for (payments.Reconcile, over the keys of every channel).
func Reconcile(ctx context.Context, db payments.DB, dedupTable string, expected []payments.Expected) (payments.Report, error) {
	applied := `(SELECT 'callbacks' AS scope, key, outcome FROM ` + dedupTable + `
WHERE scope LIKE 'POST /callbacks/{channel}#%' AND state = 'finished' AND status = 200)`
	return payments.Reconcile(ctx, db, applied, "callbacks", expected)
}
