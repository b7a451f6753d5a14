package channels_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/examples/channels"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// result is what one consumer made of a channel's stream.
type result struct {
	pool   *pgxpool.Pool // the test's schema
	report channels.Report
	stats  consumer.Stats
	seen   *seen
	dlq    []kafkago.Message // the dead-letter topic
	// outcome of each line, worked out from the tables and the recorders:
	// applied or recorded (its event is in channel_events from this
	// delivery), else dead-lettered, else duplicate.
	outcome map[int]channels.Outcome
}

// consume produces f's stream to a fresh Kafka topic, keyed by order, and
// consumes it through adapters/kafka into a fresh Postgres schema with ch's
// configuration (changed by tweak), until every record is acknowledged;
// then reconciles the tables with f's expected end state.
func consume(t *testing.T, ch channels.Channel, f channels.Fixture, tweak func(*consumer.Config[pgx.Tx])) *result {
	t.Helper()
	pool, schema := database(t, f)
	store := pgtest.Store(t, pool, schema)

	brokers := testenv.KafkaBrokers(t)
	a := newAdmin(t, brokers)
	topic := topicName(t)
	a.createTopic(t, topic, partitions)
	a.createTopic(t, topic+".dlq", 1)
	msgs := make([]kafkago.Message, len(f.Stream))
	for i, d := range f.Stream {
		msgs[i] = kafkago.Message{Key: []byte(d.Order), Value: []byte(d.Value),
			Headers: []kafkago.Header{{Key: lineHeader, Value: []byte(strconv.Itoa(d.Line))}}}
	}
	a.produce(t, topic, msgs)

	src, err := kafka.New(kafka.Config{
		Brokers: brokers, Topics: []string{topic}, Group: topic,
		MaxWait: 100 * time.Millisecond, RequestTimeout: 3 * time.Second, ReconnectBackoff: 500 * time.Millisecond,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
		JoinGroupBackoff: 200 * time.Millisecond, CloseTimeout: 10 * time.Second, Logger: testenv.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	s := newSeen(src) // the Source writes the dead letters (to topic.dlq)

	cfg := channels.Config(ch, func(tx pgx.Tx) payments.DB { return payments.Pgx(tx) })
	cfg.Source, cfg.Store, cfg.DeadLetter = src, store, s
	cfg.OnDuplicate = s.onDuplicate
	cfg.Observer = s
	cfg.Middleware = []consumer.Middleware[pgx.Tx]{s.middleware}
	cfg.Logger = testenv.Logger(t)
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitUntil(t, 3*time.Minute, "every record of "+topic+" is acknowledged", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned before the stream was consumed: %v", err)
		default:
		}
		hwm, committed, err := a.offsets(timeout(t, 10*time.Second), topic, topic, partitions)
		for p := range hwm {
			if hwm[p] == 0 {
				committed[p] = 0 // an empty partition: nothing to commit
			}
		}
		return err == nil && slices.Equal(hwm, committed)
	})
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopCancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}

	r := &result{pool: pool, stats: c.Stats(), seen: s, dlq: a.readAll(t, topic+".dlq"), outcome: map[int]channels.Outcome{}}
	staleTable := pgx.Identifier{schema, "idem_dedup_stale"}.Sanitize()
	r.report, err = channels.Reconcile(timeout(t, time.Minute), payments.Pgx(pool), store.Table(), staleTable, cfg.Name, f.Expected)
	if err != nil {
		t.Fatal(err)
	}

	// The premise of the expectations: each partition delivered its lines
	// in stream order (an order's callbacks share a partition).
	for p, byOffset := range s.at {
		offsets := make([]int64, 0, len(byOffset))
		for o := range byOffset {
			offsets = append(offsets, o)
		}
		slices.Sort(offsets)
		for i := 1; i < len(offsets); i++ {
			if byOffset[offsets[i-1]] >= byOffset[offsets[i]] {
				t.Fatalf("partition %d holds line %d before line %d", p, byOffset[offsets[i-1]], byOffset[offsets[i]])
			}
		}
	}

	rows, err := pool.Query(timeout(t, time.Minute), `SELECT source, effect FROM channel_events`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var source, effect string
		if err := rows.Scan(&source, &effect); err != nil {
			t.Fatal(err)
		}
		line, ok := s.byID[source]
		if !ok {
			t.Fatalf("channel_events names a source no message had: %s", source)
		}
		r.outcome[line] = channels.Outcome(effect)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Stream {
		switch _, letter := s.letters[d.Line]; {
		case r.outcome[d.Line] != "":
		case letter:
			r.outcome[d.Line] = channels.DeadLettered
		case s.duplicates[d.Line]:
			r.outcome[d.Line] = channels.Duplicate
		case s.stale[d.Line]:
			r.outcome[d.Line] = channels.Stale
		}
	}
	return r
}

// check compares every line's outcome, and a dead letter's reason, with
// what the stream expects; and the dead-letter topic with the letters.
func (r *result) check(t *testing.T, f channels.Fixture, whole bool) {
	t.Helper()
	bad := 0
	for _, d := range f.Stream {
		want, reason := d.Expect, d.Reason
		if whole {
			want, reason = d.ExpectWhole, d.ReasonWhole
		}
		got := r.outcome[d.Line]
		l := r.seen.letters[d.Line]
		switch {
		case got != want:
			t.Errorf("line %d (%s, attempt %d): %s, want %s %s (letter: %v)", d.Line, d.Event, d.Attempt, got, want, reason, l.Reason)
		case want == channels.DeadLettered && !errors.Is(l.Reason, reason.Err()):
			t.Errorf("line %d (%s): dead-lettered with %v, want %v", d.Line, d.Event, l.Reason, reason.Err())
		default:
			continue
		}
		if bad++; bad > 20 {
			t.Fatal("too many wrong lines")
		}
	}
	lettered := map[int]bool{}
	for _, m := range r.dlq {
		line, reason := letterHeader(m, wire.MetaReason)
		if reason == "" {
			t.Errorf("dead letter of line %d has no %s", line, wire.MetaReason)
		}
		lettered[line] = true
	}
	for line := range r.seen.letters {
		if !lettered[line] {
			t.Errorf("line %d was dead-lettered, but is not on the dead-letter topic", line)
		}
	}
	if len(lettered) != len(r.seen.letters) {
		t.Errorf("%d lines on the dead-letter topic, %d dead-lettered", len(lettered), len(r.seen.letters))
	}
}

func channelsUnderTest() []channels.Channel {
	k := channels.TestKeys()
	return []channels.Channel{
		channels.Alipay{Secret: k.Alipay},
		channels.WeChatPay{Secret: k.WeChatPay, Serial: k.WeChatPaySerial},
		channels.Stripe{Secret: k.Stripe},
	}
}

// TestChannelsOverKafka: each channel's stream, through Kafka into
// Postgres, with the channel's key and field fingerprint. Every distinct
// event is applied once, in business order; every re-send is a duplicate,
// none a mismatch; forged and mis-paid callbacks are dead-lettered with
// their reason and move no money; the tables reconcile.
func TestChannelsOverKafka(t *testing.T) {
	for _, ch := range channelsUnderTest() {
		t.Run(ch.Name(), func(t *testing.T) {
			t.Parallel()
			f := load(t, ch.Name())
			r := consume(t, ch, f, nil)
			t.Logf("%v; stats %+v; duplicates no older than %v", r.report, r.stats, r.stats.DuplicateAge.Max)
			if !r.report.OK() {
				t.Error(r.report)
			}
			r.check(t, f, false)
			r.checkNewest(t, ch, f)
			if got, want := r.stats.Stale, int64(f.Expected.Fields.Stale); got != want || want == 0 {
				t.Errorf("%d stale events counted, want %d (and some)", got, want)
			}
			if want := int64(f.Expected.Fields.Duplicates); r.stats.Duplicates < want {
				t.Errorf("%d duplicates counted, want at least %d", r.stats.Duplicates, want)
			}
			for line, l := range r.seen.letters {
				if errors.Is(l.Reason, dedup.ErrFingerprintMismatch) {
					t.Errorf("line %d: a mismatch: %v", line, l.Reason)
				}
			}
		})
	}
}

// TestWholePayloadDeadLettersResends is the problem the field fingerprints
// solve: fingerprinted over the whole payload, every re-send — a new
// timestamp and signature, the same event — is dead-lettered as a
// mismatch, same key with a different payload, instead of skipped. The
// business state is the same (the first delivery of each event applied);
// the dead-letter topic fills with false alarms.
func TestWholePayloadDeadLettersResends(t *testing.T) {
	for _, ch := range channelsUnderTest() {
		t.Run(ch.Name(), func(t *testing.T) {
			t.Parallel()
			f := load(t, ch.Name())
			r := consume(t, ch, f, func(c *consumer.Config[pgx.Tx]) { c.Fingerprint = consumer.WholePayload() })
			if !r.report.OK() {
				t.Error(r.report)
			}
			r.check(t, f, true)
			mismatches := 0
			for _, l := range r.seen.letters {
				if errors.Is(l.Reason, dedup.ErrFingerprintMismatch) {
					mismatches++
				}
			}
			want := f.Expected.WholePayload.DeadLetters[channels.FingerprintMismatch]
			t.Logf("%d of %d deliveries dead-lettered as mismatches; with the field fingerprint: %d duplicates, no mismatch",
				mismatches, len(f.Stream), f.Expected.Fields.Duplicates)
			if mismatches != want || want < f.Expected.Fields.Duplicates {
				t.Errorf("%d re-sends dead-lettered as mismatches, want %d (at least the %d duplicates)", mismatches, want, f.Expected.Fields.Duplicates)
			}
		})
	}
}

// TestForgeryAheadTakesTheKeyWhenOnlyTheHandlerVerifies shows why the
// channels verify signatures with consumer.Config.Validate: with the signature checked
// only in the handler, a forged callback that arrives before the genuine one
// with its trade number and status claims that key, fails there and has it
// recorded as failed — and the genuine payment that follows is
// dead-lettered without running the handler. The order stays unpaid
// although the buyer paid.
func TestForgeryAheadTakesTheKeyWhenOnlyTheHandlerVerifies(t *testing.T) {
	for _, ch := range channelsUnderTest() {
		t.Run(ch.Name(), func(t *testing.T) {
			t.Parallel()
			f := load(t, ch.Name())
			r := consume(t, ch, f, func(c *consumer.Config[pgx.Tx]) { c.Validate = nil })
			var forged channels.Delivery
			for _, d := range f.Stream {
				if d.Forged != "" && d.Forged != "signature" {
					forged = d
				}
			}
			if forged.Line == 0 {
				t.Fatal("no forgery ahead of a genuine event in the stream")
			}
			if l := r.seen.letters[forged.Line]; !errors.Is(l.Reason, channels.ErrBadSignature) || l.Key.ID != forged.Event {
				t.Errorf("the forgery: dead-lettered with %v under key %q, want a bad signature under %q", l.Reason, l.Key.ID, forged.Event)
			}
			genuine := 0
			for _, d := range f.Stream {
				if d.Event != forged.Event || d.Forged != "" {
					continue
				}
				genuine++
				if l := r.seen.letters[d.Line]; !errors.Is(l.Reason, dedup.ErrFailedBefore) {
					t.Errorf("genuine line %d: %s, letter %v; want dead-lettered as failed before", d.Line, r.outcome[d.Line], l.Reason)
				}
			}
			if genuine == 0 || r.report.OK() {
				t.Errorf("%d genuine deliveries; %v", genuine, r.report)
			}
			t.Logf("the genuine payment of order %s lost: %v", forged.Order, r.report)
		})
	}
}

// statusNamed is the order status an event of kind names as the newest of
// its order: what the order must end in.
var statusNamed = map[channels.Kind]string{
	channels.Pay: "PAID", channels.Finish: "FINISHED", channels.Refund: "REFUNDED",
	channels.PartialRefund: "PAID", channels.Info: "UNPAID",
}

// checkNewest checks, independently of the oracle, that every order ends
// in the status its newest genuine event names (the highest version
// Channel.Entity gives; forged and wrong callbacks are refused and name
// nothing), however its events arrived.
func (r *result) checkNewest(t *testing.T, ch channels.Channel, f channels.Fixture) {
	t.Helper()
	type newest struct {
		v      dedup.Version
		status string
		line   int
	}
	want := map[string]newest{}
	for _, d := range f.Stream {
		if d.Forged != "" || d.Wrong != "" {
			continue
		}
		m := &consumer.Message{Value: []byte(d.Value)}
		e, err := ch.Entity(m)
		if err != nil {
			t.Fatalf("line %d: %v", d.Line, err)
		}
		ev, err := ch.Decode(m.Value)
		if err != nil {
			t.Fatalf("line %d: %v", d.Line, err)
		}
		if n, ok := want[e.Name]; !ok || e.Version.Compare(n.v) > 0 {
			want[e.Name] = newest{e.Version, statusNamed[ev.Kind], d.Line}
		}
	}
	rows, err := r.pool.Query(timeout(t, time.Minute), `SELECT id, status FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ ID, Status string }])
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, o := range got {
		n, ok := want[o.ID]
		if !ok {
			continue // no genuine event: the forged and the mis-paid stay unpaid
		}
		checked++
		if o.Status != n.status {
			t.Errorf("order %s is %s; its newest event (line %d, version %s) names %s", o.ID, o.Status, n.line, n.v, n.status)
		}
	}
	if checked == 0 || checked != len(want) {
		t.Errorf("%d orders checked, %d named by events", checked, len(want))
	}
}

// TestShuffledCallbacksEndInTheNewestState: each channel's stream, every
// delivery re-sent as generated, shuffled as a gateway's retries and a
// broker's partitions can shuffle them (seeded: the same on every run),
// through Kafka into Postgres. Whatever the order, every order ends in the
// status its newest event names — Apply has no guard of its own: the
// entity order keeps older events from it — and the money reconciles.
// (The per-line outcomes and the transitions differ from the stream's
// order; those are TestChannelsOverKafka's.)
func TestShuffledCallbacksEndInTheNewestState(t *testing.T) {
	for i, ch := range channelsUnderTest() {
		t.Run(ch.Name(), func(t *testing.T) {
			t.Parallel()
			f := load(t, ch.Name())
			rng := rand.New(rand.NewPCG(uint64(i+1), 40))
			rng.Shuffle(len(f.Stream), func(a, b int) { f.Stream[a], f.Stream[b] = f.Stream[b], f.Stream[a] })
			moved := 0
			for j := range f.Stream {
				if f.Stream[j].Line != j+1 {
					moved++
				}
				f.Stream[j].Line = j + 1 // the order they now arrive in
			}
			r := consume(t, ch, f, nil)
			r.checkNewest(t, ch, f)
			for _, p := range r.report.Problems {
				if strings.Contains(p, "ledger") || strings.Contains(p, "balance is not") {
					t.Errorf("the money does not reconcile: %s", p)
				}
			}
			t.Logf("%d of %d deliveries moved; %d stale; %v", moved, len(f.Stream), r.stats.Stale, r.report)
			if r.stats.Stale == 0 {
				t.Error("no stale event: the shuffle proves nothing")
			}
		})
	}
}
