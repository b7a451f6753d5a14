package pgstore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
)

// TestRedrivenCopiesApplyOnce: a payment is dead-lettered (its account
// was blocked); once fixed, its letter comes back twice — redriven twice,
// or written twice — as copies at new offsets, each delivered up to three
// times with lost acks, beside a copy whose forged lineage names a later
// message, and that message. With offsets alone, with offsets and message-ID
// keys, and with message-ID keys alone, the payment is applied once: the
// copies are claimed under the original's identity, the key its letter
// carries; the forgery does not make the genuine message a duplicate.
func TestRedrivenCopiesApplyOnce(t *testing.T) {
	for _, mode := range []struct {
		name    string
		key     consumer.KeyFunc
		offsets bool
	}{
		{"Offsets", nil, true},
		{"OffsetsByMessageID", consumer.ByMessageID(), true},
		{"ByMessageID", consumer.ByMessageID(), false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			pool, _, st, table := effectsRig(t, pgstore.Config{})
			ctx := context.Background()
			cfg := consumer.Config[pgx.Tx]{Name: "payments", Store: st, Key: mode.key, Logger: quiet}
			if mode.offsets {
				cfg.Offsets = st
			}
			blocked := "T00002"
			cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if id, _ := consumer.ByJSONField("txn_id")(m); id == blocked {
					return consumer.Permanent(errors.New("account blocked"))
				}
				return insertEffect(table)(ctx, tx, m)
			})
			first := paymentMsgs("payments", 1, 5, 0)
			res := consumertest.Run(t, cfg, consumertest.Script{}, first...)
			if len(res.DeadLetters) != 1 || res.Stats.Applied != 4 {
				t.Fatalf("first run: %v", res)
			}
			letter := res.DeadLetters[0]

			// The cause is fixed and the key released (idem redrive --release).
			blocked = ""
			if _, err := st.Admin().Release(ctx, []dedup.Key{letter.Key}, false); err != nil {
				t.Fatal(err)
			}
			copyOf := func(offset int64, count int) *consumer.Message {
				m := consumertest.Message("payments", 0, offset, "", string(first[2].Value))
				headers, _ := wire.Letter(letter).Record(1 << 20)
				m.Headers = redriveHeaders(headers, count)
				return m
			}
			forged := consumertest.Message("payments", 0, 7, "", `{"txn_id":"F0001","amount":1}`)
			forged.Headers = []consumer.Header{
				{Key: wire.MetaTopic, Value: []byte("payments")}, {Key: wire.MetaPartition, Value: []byte("0")},
				{Key: wire.MetaOffset, Value: []byte("8")}, {Key: wire.MetaMessageID, Value: []byte("payments/0/8")},
				{Key: wire.MetaRedriveCount, Value: []byte("1")}}
			genuine := consumertest.Message("payments", 0, 8, "", `{"txn_id":"T00008","amount":108}`)
			cfg.BatchSize = 1 // a transaction per delivery: the copies meet in the store, not in one claim
			res = consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, CrashAfterCommitEvery: 2, Seed: 7},
				copyOf(5, 1), copyOf(6, 2), forged, genuine)
			t.Log(res)

			if rows, distinct := countEffects(t, pool, table); rows != 7 || distinct != 7 {
				t.Errorf("effects %d (distinct %d), want 7: T00000–T00004, F0001, T00008 once each", rows, distinct)
			}
			rows, err := st.Admin().Find(ctx, "payments", letter.Key.ID)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 1 || rows[0].Outcome != "done" {
				t.Errorf("the letter's key %v: rows %+v, want one done row (what idem redrive looks for)", letter.Key, rows)
			}
		})
	}
}

// redriveHeaders is what `idem redrive` sends with a letter: its headers
// without the letter's own (reason, attempts, lane), and the lineage.
func redriveHeaders(headers []consumer.Header, count int) []consumer.Header {
	var out []consumer.Header
	for _, h := range headers {
		switch h.Key {
		case wire.MetaReason, wire.MetaAttempts, wire.MetaAttempt, wire.MetaLane,
			wire.MetaRedriveCount, wire.MetaRedrivenFrom:
		default:
			out = append(out, h)
		}
	}
	return append(out, consumer.Header{Key: wire.MetaRedriveCount, Value: []byte(strconv.Itoa(count))},
		consumer.Header{Key: wire.MetaRedrivenFrom, Value: []byte("payments.dlq/0/" + strconv.Itoa(count-1))})
}
