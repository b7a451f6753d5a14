package relaytest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/outbox"
)

// NewOutbox migrates an outbox into a fresh schema; pool's search_path is
// that schema.
func NewOutbox(t testing.TB) (*outbox.Outbox, *pgxpool.Pool, string) {
	t.Helper()
	pool, schema := testenv.SchemaPool(t)
	return OutboxIn(t, pool, schema), pool, schema
}

// OutboxIn migrates an outbox into schema, beside what else the test keeps
// there (a store, business tables).
func OutboxIn(t testing.TB, pool *pgxpool.Pool, schema string) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(testenv.Context(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	return ob
}

// StartRelay runs a relay until the test ends, then stops it gracefully.
// Unset, the poll is 5ms and the backoff 5ms to 200ms.
func StartRelay(t testing.TB, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testenv.Logger(t)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 5 * time.Millisecond
	}
	if cfg.Backoff == (consumer.RetryPolicy{}) {
		cfg.Backoff = consumer.RetryPolicy{Initial: 5 * time.Millisecond, Max: 200 * time.Millisecond}
	}
	r, err := outbox.NewRelay(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("relay Stop: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("relay Run: %v", err)
		}
	})
	return r
}

// Pending counts the outbox's unsent rows.
func Pending(t testing.TB, pool *pgxpool.Pool, ob *outbox.Outbox) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(testenv.Context(t, time.Minute), `SELECT count(*) FROM `+ob.Table()+` WHERE sent_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Dead is a row of the dead-letter table.
type Dead struct {
	ID, Topic, Reason string
	Value             []byte
}

// DeadLetters reads the dead-letter table in seq order.
func DeadLetters(t testing.TB, pool *pgxpool.Pool, ob *outbox.Outbox) []Dead {
	t.Helper()
	rows, err := pool.Query(testenv.Context(t, time.Minute), `SELECT id, topic, reason, value FROM `+ob.DeadTable()+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Dead
	for rows.Next() {
		var d Dead
		if err := rows.Scan(&d.ID, &d.Topic, &d.Reason, &d.Value); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Refusal is a record a publisher refuses for good: its value, and what the
// reason of its dead letter says besides "refused by the broker".
type Refusal struct {
	Value []byte
	Says  string
}

// CheckRefusals checks the dead-letter table once relay drained the
// outbox: a letter for each refusal of want, in order, with its value and
// reason; and relay's stats count them dead-lettered, and published
// records published.
func CheckRefusals(t testing.TB, relay *outbox.Relay, pool *pgxpool.Pool, ob *outbox.Outbox, published int, want ...Refusal) {
	t.Helper()
	dead := DeadLetters(t, pool, ob)
	if len(dead) != len(want) {
		t.Fatalf("%d dead letters, want %d: %+v", len(dead), len(want), dead)
	}
	for i, c := range want {
		d := dead[i]
		if !bytes.Equal(d.Value, c.Value) || !strings.Contains(d.Reason, "refused by the broker") || !strings.Contains(d.Reason, c.Says) {
			t.Errorf("dead letter %d: %d bytes, reason %q, want %d bytes and %q", i, len(d.Value), d.Reason, len(c.Value), c.Says)
		}
	}
	if st := relay.Stats(); st.DeadLettered != int64(len(want)) || st.Published != int64(published) {
		t.Fatalf("stats %+v", st)
	}
}
