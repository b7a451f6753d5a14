package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
)

// TestRedriveTwiceAppliesOnce: with keys that name the message — its
// message ID, or offsets in the store alone — a payment of a blocked
// account is dead-lettered, and its letter is written twice (dead letters
// are at-least-once). The account is fixed and both letters are redriven
// while the consumer is down, so that both copies reach it; then the
// letters are redriven again by a second group (as a redrive that crashed
// between its send and its offset commit would run again). The payment is
// applied once: the copies, at new offsets, are deduplicated by the
// identity they were first delivered with (idem-original-*), and the
// second redrive finds that identity's done row and passes them by as
// duplicates.
func TestRedriveTwiceAppliesOnce(t *testing.T) {
	for _, mode := range []struct {
		name    string
		key     consumer.KeyFunc
		offsets bool
	}{
		{"ByMessageID", consumer.ByMessageID(), false},
		{"Offsets", nil, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			p := newPayments(t)
			p.key, p.offsets = mode.key, mode.offsets
			ctx := context.Background()
			// No primary key: a payment applied twice is two rows.
			if _, err := p.pool.Exec(ctx, `ALTER TABLE ledger DROP CONSTRAINT ledger_pkey; INSERT INTO blocked VALUES ('T03')`); err != nil {
				t.Fatal(err)
			}
			p.produce("T00", "T01", "T02", "T03", "T04")
			p.start()
			p.waitFor("5 settled", func(s consumer.Stats) bool { return s.Applied+s.DeadLettered == 5 })
			if s := p.consumer.Stats(); s.Applied != 4 || s.DeadLettered != 1 {
				t.Fatalf("stats %+v", s)
			}
			copyLetter(t, p, p.dlq, 0) // the letter written twice
			if _, err := p.pool.Exec(ctx, `DELETE FROM blocked`); err != nil {
				t.Fatal(err)
			}
			redrive := func(args ...string) redriveJSON {
				t.Helper()
				code, out, _ := idem(t, "", p.envs, append([]string{"redrive", "--topic", p.dlq, "--release", "--skip", "--json"}, args...)...)
				rd := decode[redriveJSON](t, out)
				if code != exitOK && code != exitPartial || len(rd.Letters) != 2 {
					t.Fatalf("redrive %v: exit %d, %+v", args, code, rd)
				}
				return rd
			}

			// The consumer is down while both letters are redriven, so
			// that both copies reach it (as after a redrive that crashed
			// before its commit and ran again).
			p.stop()
			if rd := redrive(); rd.Counts["sent"] != 2 {
				t.Fatalf("the first redrive did not send both letters: %+v", rd)
			}
			p.start()
			p.waitFor("both copies settled", func(s consumer.Stats) bool { return s.Applied+s.Duplicates+s.DeadLettered == 2 })
			if s := p.consumer.Stats(); s.Applied != 1 || s.Duplicates != 1 {
				t.Errorf("the two copies: %+v, want one applied and one duplicate", s)
			}

			// Redriven again (another group): both letters name an
			// applied payment and are passed by as duplicates.
			rd := redrive("--group", "again")
			for _, l := range rd.Letters {
				if l.Action != "duplicate" || !strings.Contains(l.Reason, "applied") {
					t.Errorf("second redrive of an applied letter: %+v", l)
				}
			}
			if sent := rd.Counts["sent"]; sent > 0 { // only without the fix: wait for what it sent
				p.waitFor("the copies settled", func(s consumer.Stats) bool { return s.Applied+s.Duplicates+s.DeadLettered == 2+int64(sent) })
			}
			if got := p.ledger(); got["T03"] != 1 || len(got) != 5 {
				t.Errorf("ledger %v: T03 applied %d times, want once", got, got["T03"])
			}
		})
	}
}

// TestRedriveRefusesAnEmptyLetterRedrivenTooOften: a letter without a
// value (a tombstone) redriven --max-redrives times already is refused,
// like any other letter, and nothing is sent.
func TestRedriveRefusesAnEmptyLetterRedrivenTooOften(t *testing.T) {
	p := newPayments(t)
	if code, _, _ := idem(t, "", p.envs, "migrate"); code != exitOK {
		t.Fatalf("migrate: exit %d", code)
	}
	w := &kafkago.Writer{Addr: kafkago.TCP(p.brokers...), Topic: p.dlq, RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, Transport: p.tr}
	defer w.Close()
	h := func(k, v string) kafkago.Header { return kafkago.Header{Key: k, Value: []byte(v)} }
	if err := w.WriteMessages(context.Background(), kafkago.Message{Key: []byte("T09"), Headers: []kafkago.Header{
		h(wire.MetaTopic, p.topic), h(wire.MetaPartition, "0"), h(wire.MetaOffset, "7"),
		h(wire.MetaMessageID, p.topic+"/0/7"), h(wire.MetaKeyScope, "pay"), h(wire.MetaKey, "T09"),
		h(wire.MetaRedriveCount, "3")}}); err != nil {
		t.Fatal(err)
	}
	topicEnd := p.end(p.topic)
	code, out, _ := idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--max-redrives", "3", "--json")
	rd := decode[redriveJSON](t, out)
	if code != exitPartial || len(rd.Letters) != 1 || rd.Letters[0].Action != "refused" || !strings.Contains(rd.Letters[0].Reason, "--max-redrives") {
		t.Errorf("redrive of an empty letter redriven 3 times, --max-redrives 3: exit %d, %+v", code, rd)
	}
	if end := p.end(p.topic); end != topicEnd {
		t.Errorf("the refused letter was sent (%d messages)", end-topicEnd)
	}
}

// copyLetter writes the record at offset of partition 0 of topic again, as
// a dead-letter write retried after a lost acknowledgement does.
func copyLetter(t *testing.T, p *payments, topic string, offset int64) {
	t.Helper()
	m := readAt(t, p.brokers, topic, offset)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w := &kafkago.Writer{Addr: kafkago.TCP(p.brokers...), Topic: topic, RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, Transport: p.tr}
	defer w.Close()
	// A topic created moments ago may not be in every broker's metadata yet.
	for {
		err := w.WriteMessages(ctx, kafkago.Message{Key: m.Key, Value: m.Value, Headers: m.Headers})
		if err == nil {
			return
		}
		if !errors.Is(err, kafkago.UnknownTopicOrPartition) || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
