package pgstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
)

// TestDeferredTriggerAtCommitIsBounded: a deferred constraint trigger that
// raises (P0001) fails the transaction at COMMIT, on a healthy connection,
// every time. The error is neither an outage nor a conflict, so it must not
// be waited out for ever (it used to wedge the lane): the message that
// causes it is isolated, retried within Retry.MaxAttempts and dead-lettered,
// and every other message is applied once.
func TestDeferredTriggerAtCommitIsBounded(t *testing.T) {
	rig := newFaultRig(t, "idem-deferred-trigger")
	ctx := context.Background()
	if _, err := rig.check.Exec(ctx, `
CREATE FUNCTION `+rig.schema+`.refuse_four() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.amount = 4 THEN RAISE EXCEPTION 'amount 4 is refused at commit'; END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER refuse_four AFTER INSERT ON `+rig.table+`
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+rig.schema+`.refuse_four();`); err != nil {
		t.Fatal(err)
	}
	const maxAttempts = 3
	msgs := rig.messages(16) // T00003 (amount 4) shares partition 3 with T00007, T00011, T00015
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: rig.st, Handler: insertEffect(rig.table), Key: consumer.ByJSONField("txn_id"),
		BatchSize: 8, Retry: consumer.RetryPolicy{MaxAttempts: maxAttempts}, Logger: quiet,
	}, consumertest.Script{}, msgs...)
	if len(res.DeadLetters) != 1 {
		t.Fatalf("dead letters %+v, want T00003's", res.DeadLetters)
	}
	l := res.DeadLetters[0]
	var pgErr *pgconn.PgError
	if l.Key.ID != "T00003" || !errors.As(l.Reason, &pgErr) || pgErr.Code != "P0001" || l.Attempts != maxAttempts {
		t.Errorf("dead letter %s after %d attempts: %v; want T00003, P0001, %d attempts", l.Key.ID, l.Attempts, l.Reason, maxAttempts)
	}
	var rows, distinct int64
	if err := rig.check.QueryRow(ctx, `SELECT count(*), count(DISTINCT txn_id) FROM `+rig.table).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != 15 || distinct != 15 {
		t.Fatalf("%d effects (%d distinct), want the 15 other messages once", rows, distinct)
	}
}
