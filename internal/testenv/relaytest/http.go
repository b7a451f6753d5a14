package relaytest

import (
	"encoding/json"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/outbox"
)

// PaymentsHandler is an idempotent API's transactional handler: it writes
// the payment of the body {"ID": …} in the table payments, enqueues it to
// topic (scope "payments") in the request's transaction, and answers 201.
// The payment "slow" closes holding and waits for hold, so that its retry
// comes while it is in flight.
func PaymentsHandler(ob *outbox.Outbox, topic string, hold <-chan struct{}, holding chan<- struct{}) httpidem.TxHandlerFunc[pgx.Tx] {
	return func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		var p struct{ ID string }
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			return err
		}
		if p.ID == "slow" {
			close(holding)
			<-hold
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO payments VALUES ($1)`, p.ID); err != nil {
			return err
		}
		if err := ob.EnqueueFor(r.Context(), tx, dedup.Key{Scope: "payments", ID: p.ID},
			outbox.Message{Topic: topic, Key: []byte(p.ID), Value: []byte(p.ID)}); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}
}
