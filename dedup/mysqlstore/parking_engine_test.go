package mysqlstore_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/mysqlstore"
	"github.com/idemkit/idem/internal/testenv/retrytest"
)

// TestKeyOrderedParkingDrivenByTheConsumer (seam 40.69): KeyOrdered
// parking on real MariaDB, driven by the consumer rather than the
// conformance suite: 40 record keys of 6 payments over 4 partitions, each
// split over 2 key lanes (8 lanes calling CheckParked, Park and Unpark at
// once, and the retry lane beside them); the second payment of every
// fifth key fails until it has been to retry twice. Every payment is
// applied once, each key's in production order, nothing dead-lettered,
// and no key is left parked.
func TestKeyOrderedParkingDrivenByTheConsumer(t *testing.T) {
	st, db := newStore(t, mysqlstore.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (id bigint AUTO_INCREMENT PRIMARY KEY, pkey varchar(16) NOT NULL, seq int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	type pay struct {
		ID  string `json:"id"`
		Key string `json:"key"`
		Seq int    `json:"seq"`
	}
	const keys, perKey = 40, 6
	src := retrytest.LoopSource{Source: consumertest.NewSource(consumertest.Script{})}
	offsets := map[int32]int64{}
	for s := range perKey {
		for k := range keys {
			p := int32(k % 4)
			v, _ := json.Marshal(pay{ID: fmt.Sprintf("k%02d-%d", k, s), Key: fmt.Sprintf("k%02d", k), Seq: s})
			src.Push(consumertest.Message("pay", p, offsets[p], fmt.Sprintf("k%02d", k), string(v)))
			offsets[p]++
		}
	}
	dl := &consumertest.DeadLetters{}
	c, err := consumer.New(consumer.Config[*sql.Tx]{
		Name: "ledger", Store: st, Source: src, DeadLetter: dl, Logger: quiet, BatchSize: 5, KeyLanes: 2,
		Key:   consumer.ByJSONField("id"),
		Retry: consumer.RetryPolicy{MaxAttempts: 1},
		Retries: consumer.NonBlocking{Attempts: 1, Delays: []time.Duration{20 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond},
			Sink: &retrytest.LoopSink{Src: src}, KeyOrdered: true},
		Handler: consumer.HandlerFunc[*sql.Tx](func(ctx context.Context, tx *sql.Tx, m *consumer.Message) error {
			var p pay
			if err := json.Unmarshal(m.Value, &p); err != nil {
				return consumer.Permanent(err)
			}
			if trip, _ := m.Header(wire.MetaRetryAttempt); p.Seq == 1 && p.Key[2]%5 == 0 && string(trip) < "2" {
				return consumer.Retryable(fmt.Errorf("%s: the account service is down", p.ID))
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (pkey, seq) VALUES (?, ?)`, p.Key, p.Seq)
			return err
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	idleErr := src.WaitIdle(ctx)
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if idleErr != nil {
		t.Fatalf("not settled: %v", idleErr)
	}
	var n, dup, out int
	q := func(s string, v *int) {
		if err := db.QueryRowContext(ctx, s).Scan(v); err != nil {
			t.Fatal(err)
		}
	}
	q(`SELECT count(*) FROM payments`, &n)
	q(`SELECT count(*) - count(DISTINCT pkey, seq) FROM payments`, &dup)
	q(`SELECT count(*) FROM payments a JOIN payments b ON a.pkey = b.pkey AND b.id > a.id AND b.seq < a.seq`, &out)
	if n != keys*perKey || dup != 0 || out != 0 {
		t.Errorf("%d payments applied (%d twice), want %d; %d applied out of their key's order", n, dup, keys*perKey, out)
	}
	if l := dl.Letters(); len(l) != 0 {
		t.Errorf("%d dead letters, want none; the first: %v %v", len(l), l[0].Cause, l[0].Reason)
	}
	if s, err := st.ParkStats(ctx); err != nil || s.Keys != 0 {
		t.Errorf("ParkStats %+v, %v after every payment applied, want no key parked", s, err)
	}
	if r := c.Stats().RetriedLater; r == 0 {
		t.Errorf("nothing went to retry: the test parked no key")
	}
}
