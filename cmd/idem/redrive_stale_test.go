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

// TestRedriveOfAStaleLetter: payments are events of one account, versioned
// by their number, with StaleDeadLetter. T04 applies, then T03 comes late:
// stale, recorded, dead-lettered with cause stale. Its key is done, so a
// redrive passes the letter by as a duplicate, in the dry run and in the
// run alike, sending nothing — and the plan must say why truly: the
// payment was never applied, its entity had moved past it.
func TestRedriveOfAStaleLetter(t *testing.T) {
	p := newPayments(t)
	src, err := kafka.New(kafka.Config{Brokers: p.brokers, Topics: []string{p.topic}, Group: p.topic, DeadLetterTopic: p.dlq, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p.consumer, p.stop = startPay(t, p.pool, p.schema, consumer.Config[pgx.Tx]{Source: src, DeadLetter: src, Key: consumer.ByJSONField("txn_id"),
		Stale: consumer.StaleDeadLetter,
		Entity: func(m *consumer.Message) (consumer.Entity, error) {
			id, err := consumer.ByJSONField("txn_id")(m)
			if err != nil {
				return consumer.Entity{}, err
			}
			n, err := strconv.ParseInt(strings.TrimPrefix(id, "T"), 10, 64)
			return consumer.Entity{Name: "acct-1", Version: dedup.Version{Major: n}}, err
		}}, false, 30*time.Second)
	p.produce("T04")
	p.waitFor("T04 applied", func(s consumer.Stats) bool { return s.Applied == 1 })
	p.produce("T03")
	p.waitFor("T03 dead-lettered", func(s consumer.Stats) bool { return s.DeadLettered == 1 })

	for _, dry := range []bool{true, false} {
		args := []string{"redrive", "--topic", p.dlq, "--json"}
		if dry {
			args = append(args, "--dry-run")
		}
		code, out, stderr := idem(t, "", p.envs, args...)
		rd := decode[redriveJSON](t, out)
		if code != exitOK || len(rd.Letters) != 1 {
			t.Fatalf("redrive (dry run %v): exit %d, %+v, %s", dry, code, rd, stderr)
		}
		l := rd.Letters[0]
		if l.Key != "T03" || l.Cause != "stale" || l.Action != "duplicate" {
			t.Errorf("redrive (dry run %v): %+v, want T03's stale letter passed by as a duplicate", dry, l)
		}
		if strings.Contains(l.Reason, "was applied") || !strings.Contains(l.Reason, "recorded stale") {
			t.Errorf("redrive (dry run %v): reason %q: T03 was never applied; it was recorded stale", dry, l.Reason)
		}
	}
	if got := p.ledger(); got["T03"] != 0 || got["T04"] != 1 {
		t.Errorf("ledger %v, want T04 alone", got)
	}
}

// TestReleaseOfAKeyItsEntityPassed: T03 fails for good (its account
// blocked) and its key is recorded failed; T04 of the same account
// applies. The block is lifted, the key released with idem release, and
// the channel re-sends T03 as a new record (no letter, no carried
// entity): Entity orders it by its payload, 3, below the watermark 4, so
// it is stale, recorded, and nothing is booked.
func TestReleaseOfAKeyItsEntityPassed(t *testing.T) {
	p := newPayments(t)
	ctx := context.Background()
	if _, err := p.pool.Exec(ctx, `INSERT INTO blocked VALUES ('T03')`); err != nil {
		t.Fatal(err)
	}
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
	p.produce("T03")
	p.waitFor("T03 dead-lettered", func(s consumer.Stats) bool { return s.DeadLettered == 1 })
	p.produce("T04")
	p.waitFor("T04 applied", func(s consumer.Stats) bool { return s.Applied == 1 })
	if _, err := p.pool.Exec(ctx, `DELETE FROM blocked`); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := idem(t, "", p.envs, "release", "--scope", "pay", "--yes", "T03"); code != exitOK {
		t.Fatalf("release: exit %d\n%s%s", code, out, stderr)
	}
	p.produce("T03")
	p.waitFor("the re-sent T03 settled", func(s consumer.Stats) bool { return s.Stale+s.Applied >= 2 })
	if s := p.consumer.Stats(); s.Stale != 1 || s.Applied != 1 || s.DeadLettered != 1 {
		t.Errorf("stats %+v, want the re-sent T03 stale", s)
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
