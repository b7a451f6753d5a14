package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// TestRedriveOfALetterItsEntityPassed: payments are events of one
// account, versioned by their number. T03 fails for good (its account
// blocked) and is dead-lettered; T04 applies and moves the account's
// watermark to 4. The block is lifted and T03's letter redriven: the plan
// sends it (it knows keys, not watermarks), and the consumer finds the
// copy stale — ordered by the version its letter carries, 3, not by its
// new offset —, records it against watermark 4 and applies nothing.
func TestRedriveOfALetterItsEntityPassed(t *testing.T) {
	p := newPayments(t)
	ctx := context.Background()
	if _, err := p.pool.Exec(ctx, `INSERT INTO blocked VALUES ('T03')`); err != nil {
		t.Fatal(err)
	}
	start := func() {
		src, err := kafka.New(kafka.Config{Brokers: p.brokers, Topics: []string{p.topic}, Group: p.topic, DeadLetterTopic: p.dlq, Logger: testenv.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		p.consumer, p.stop = startPay(t, p.pool, p.schema, consumer.Config[pgx.Tx]{Source: src, DeadLetter: src, Key: consumer.ByJSONField("txn_id"),
			Entity: func(m *consumer.Message) (consumer.Entity, error) {
				id, err := consumer.ByJSONField("txn_id")(m)
				if err != nil {
					return consumer.Entity{}, err
				}
				n, err := strconv.ParseInt(strings.TrimPrefix(id, "T"), 10, 64)
				return consumer.Entity{Name: "acct-1", Version: dedup.Version{Major: n}}, err
			}}, false, 30*time.Second)
	}
	p.produce("T03")
	start()
	p.waitFor("T03 dead-lettered", func(s consumer.Stats) bool { return s.DeadLettered == 1 })
	p.produce("T04")
	p.waitFor("T04 applied", func(s consumer.Stats) bool { return s.Applied == 1 })
	if _, err := p.pool.Exec(ctx, `DELETE FROM blocked`); err != nil {
		t.Fatal(err)
	}

	code, out, _ := idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--release", "--json")
	rd := decode[redriveJSON](t, out)
	if code != exitOK || rd.Counts["sent"] != 1 {
		t.Fatalf("redrive: exit %d, %+v", code, rd)
	}
	p.waitFor("the copy settled", func(s consumer.Stats) bool { return s.Stale+s.Applied >= 2 })
	if s := p.consumer.Stats(); s.Stale != 1 || s.Applied != 1 || s.DeadLettered != 1 {
		t.Errorf("stats %+v, want the copy stale", s)
	}
	if got := p.ledger(); got["T03"] != 0 || got["T04"] != 1 {
		t.Errorf("ledger %v, want T04 alone", got)
	}
	st, err := pgstore.New(p.pool, pgstore.Config{Schema: p.schema})
	if err != nil {
		t.Fatal(err)
	}
	stale, err := st.StaleEvents(ctx, dedup.StaleFilter{Entity: "acct-1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || stale[0].Key.ID != "T03" || stale[0].Version.Major != 3 || stale[0].Watermark.Major != 4 {
		t.Errorf("stale records %+v, want T03 at version 3 against watermark 4", stale)
	}
}
