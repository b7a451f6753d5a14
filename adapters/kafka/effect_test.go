package kafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/effect"
)

// The effect journal where it meets the settings that existed before it
// (issue 39): every copy of a message — a retry copy, a redelivery after a
// restart, a batch re-run one by one — must find the step its first
// delivery began, under the same provider key, and never call the provider
// for it again once it executed. Real Kafka and Postgres; the provider is
// in memory, with its own ledger.

// refundProvider executes a refund once per provider key and remembers
// what it executed; a request of a txn in timeouts executes and then
// times out (the response is lost).
type refundProvider struct {
	mu       sync.Mutex
	executed map[string]int64 // provider key → the amount executed: the truth
	calls    map[string]int   // requests per provider key
	timeouts map[string]int   // txn → how many of its requests still time out after executing
	reads    int
	lagging  bool // the query finds nothing yet
}

func newRefundProvider() *refundProvider {
	return &refundProvider{executed: map[string]int64{}, calls: map[string]int{}, timeouts: map[string]int{}}
}

func (p *refundProvider) refund(txn string, amount int64, c effect.Call) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[c.ProviderKey]++
	if _, ok := p.executed[c.ProviderKey]; !ok {
		p.executed[c.ProviderKey] = amount
	}
	if p.timeouts[txn] > 0 {
		p.timeouts[txn]--
		return nil, errors.New("read tcp 127.0.0.1:443: i/o timeout")
	}
	return []byte(fmt.Sprint(p.executed[c.ProviderKey])), nil
}

func (p *refundProvider) query(c effect.Call) (effect.ReadBack, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads++
	if a, ok := p.executed[c.ProviderKey]; ok && !p.lagging {
		return effect.ReadBack{Status: effect.Executed, Result: []byte(fmt.Sprint(a))}, nil
	}
	return effect.ReadBack{Status: effect.NotFound}, nil
}

// requireOnce fails unless the provider executed n refunds, each called
// exactly once.
func (p *refundProvider) requireOnce(t testing.TB, n int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.executed) != n || len(p.calls) != n {
		t.Fatalf("provider executed %d refunds under %d provider keys, want %d of each: %v", len(p.executed), len(p.calls), n, p.calls)
	}
	for k, c := range p.calls {
		if c != 1 {
			t.Fatalf("provider key %s called %d times, want once (calls %v)", k, c, p.calls)
		}
	}
}

// refundHandler books a payment after refunding it through the journal of
// b's store; the ledger's amount is what the provider answered.
func (b *bank) refundHandler(p *refundProvider, s effect.Step) consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var pay payment
		if err := json.Unmarshal(m.Value, &pay); err != nil {
			return consumer.Permanent(err)
		}
		s := s
		s.Call = func(ctx context.Context, c effect.Call) ([]byte, error) { return p.refund(pay.TxnID, pay.Amount, c) }
		if s.ReadBack != nil {
			s.ReadBack = func(ctx context.Context, c effect.Call) (effect.ReadBack, error) { return p.query(c) }
		}
		res, err := effect.Do(ctx, b.store, m, s)
		if err != nil {
			return err
		}
		var amount int64
		if _, err := fmt.Sscan(string(res), &amount); err != nil {
			return fmt.Errorf("provider answer %q: %w", res, err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+b.table+` (txn_id, amount, source) VALUES ($1, $2, $3)`, pay.TxnID, amount, m.Coordinates())
		return err
	})
}

// errAccountFrozen: frozenRefundHandler refuses a payment with the frozen
// header after its refund executed, which leaves its key free.
var errAccountFrozen = errors.New("account frozen")

// frozenRefundHandler refunds a payment through the journal j, then
// rejects it when it has the frozen header, else books its amount.
func (b *bank) frozenRefundHandler(j dedup.Journal, p *refundProvider) consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var pay payment
		if err := json.Unmarshal(m.Value, &pay); err != nil {
			return consumer.Permanent(err)
		}
		s := refundStep()
		s.Call = func(ctx context.Context, c effect.Call) ([]byte, error) { return p.refund(pay.TxnID, pay.Amount, c) }
		s.ReadBack = func(ctx context.Context, c effect.Call) (effect.ReadBack, error) { return p.query(c) }
		if _, err := effect.Do(ctx, j, m, s); err != nil {
			return err
		}
		if _, ok := m.Header("frozen"); ok {
			return consumer.Reject(errAccountFrozen)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+b.table+` (txn_id, amount, source) VALUES ($1, $2, $3)`, pay.TxnID, pay.Amount, m.Coordinates())
		return err
	})
}

func refundStep() effect.Step {
	return effect.Step{Name: "refund", KeyTTL: time.Hour, Lease: 5 * time.Second,
		ReadBack: func(context.Context, effect.Call) (effect.ReadBack, error) { return effect.ReadBack{}, nil }}
}

func producePayments(t *testing.T, a *admin, topic string, n int, prefix string) {
	t.Helper()
	var msgs []kafkago.Message
	for i := range n {
		id := fmt.Sprintf("%s-%02d", prefix, i)
		v, _ := json.Marshal(payment{TxnID: id, Amount: int64(100 + i)})
		msgs = append(msgs, kafkago.Message{Key: []byte(id), Value: v})
	}
	a.Produce(t, topic, msgs...)
}

// requireLedgerMatchesProvider fails unless the ledger has one row per
// transaction, n in all, each with the amount the provider executed.
func (b *bank) requireLedgerMatchesProvider(t testing.TB, n int) {
	t.Helper()
	if rows, distinct := b.rows(t); rows != n || distinct != n {
		t.Fatalf("ledger: %d rows, %d transactions; want %d of each", rows, distinct, n)
	}
}

// TestKafkaEffectRetryCopyFindsItsStep (39.1): NonBlocking retries with
// the tenant taken from the topic, with and without KeyOrdered. A refund
// executes and its response is lost; the message goes to a retry topic.
// Its copy must find the same step (same scope, key, provider key), read
// it back and not call again.
func TestKafkaEffectRetryCopyFindsItsStep(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("KeyOrdered=%v", ordered), func(t *testing.T) {
			delays := []time.Duration{300 * time.Millisecond}
			brokers, a, topic, group := retryTest(t, 1, delays)
			b := newTestBank(t)
			p := newRefundProvider()
			p.timeouts["r-03"] = 1
			producePayments(t, a, topic, 6, "r")

			scfg := realSourceConfig(t, brokers, topic, group)
			scfg.RetryDelays = delays
			src := newSource(t, scfg)
			cfg := b.config(src, src)
			cfg.Logger = testLogger(t)
			cfg.Handler = b.refundHandler(p, refundStep())
			cfg.Tenant = func(m *consumer.Message) (string, error) { return m.Topic, nil }
			cfg.Retry = consumer.RetryPolicy{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: time.Minute}
			cfg.Retries = consumer.NonBlocking{Attempts: 1, Delays: delays, Sink: src, KeyOrdered: ordered}
			r := start(t, cfg)
			waitUntil(t, time.Minute, "every refund booked", func() bool { rows, _ := b.rows(t); return rows >= 6 })
			a.WaitNoLag(t, group, topic)
			waitSettled(t, a, group, kafka.RetryTopic(topic, delays[0]))
			r.Stop(t)

			if st := r.Stats(); st.RetriedLater != 1 {
				t.Fatalf("stats %+v: want the refund whose answer was lost sent to retry once", st)
			}
			b.requireLedgerMatchesProvider(t, 6)
			p.requireOnce(t, 6)
			rec, ok, err := b.store.Step(ctxTimeout(t, 10*time.Second), dedup.StepRef{Key: dedup.Key{Scope: "payments/" + topic, ID: "r-03"}, Step: "refund"})
			if err != nil || !ok || rec.State != dedup.StepSucceeded || rec.Attempts != 1 {
				t.Fatalf("step of r-03 in the original's scope: %+v %v %v; want succeeded after 1 attempt", rec, ok, err)
			}
		})
	}
}

// TestKafkaEffectOffsetsRedeliveryFindsItsStep (39.3): offsets in the
// store, no key rows. A refund executes and its response is lost; the
// consumer is killed while its retry waits. The next consumer, started from the
// store's offsets, is delivered the message again: Do has a key, finds
// the step and reads it back instead of calling.
func TestKafkaEffectOffsetsRedeliveryFindsItsStep(t *testing.T) {
	brokers, a, topic, group := kafkaTest(t, 1)
	b := newTestBank(t)
	p := newRefundProvider()
	p.timeouts["o-02"] = 1
	producePayments(t, a, topic, 5, "o")

	run := func() *running {
		scfg := realSourceConfig(t, brokers, topic, group)
		scfg.StartOffsets = kafka.StoreOffsets(b.store, "payments")
		cfg := b.offsetsConfig(t, b.store, newSource(t, scfg))
		cfg.Handler = b.refundHandler(p, refundStep())
		cfg.Retry = consumer.RetryPolicy{Initial: time.Hour, Max: time.Hour, MaxAttempts: 1000, MaxElapsed: 3 * time.Hour}
		return start(t, cfg)
	}
	r := run()
	waitUntil(t, time.Minute, "the lost answer recorded unknown", func() bool {
		steps, err := b.store.Steps(ctxTimeout(t, 10*time.Second), dedup.StepFilter{States: []dedup.StepState{dedup.StepUnknown}})
		return err == nil && len(steps) == 1
	})
	r.Kill(t) // a graceful Stop would wait the retry out
	r = run()
	waitUntil(t, time.Minute, "every refund booked", func() bool { rows, _ := b.rows(t); return rows >= 5 })
	r.Stop(t)
	b.requireLedgerMatchesProvider(t, 5)
	p.requireOnce(t, 5)
}

// TestKafkaEffectBatchKeepsSucceededSteps (39.4): BatchSize 10 with a
// per-message Handler. One refund's answer is lost: its unknown outcome
// rolls the batch back, yet the other refunds' steps, which succeeded,
// stay succeeded and are answered from the journal on the re-run; the
// lost one is read back. Each refund reaches the provider once.
func TestKafkaEffectBatchKeepsSucceededSteps(t *testing.T) {
	brokers, a, topic, group := kafkaTest(t, 1)
	b := newTestBank(t)
	p := newRefundProvider()
	p.timeouts["b-05"] = 1
	producePayments(t, a, topic, 10, "b")

	src := newSource(t, realSourceConfig(t, brokers, topic, group))
	cfg := b.config(src, &consumertest.DeadLetters{})
	cfg.Logger = testLogger(t)
	cfg.BatchSize = 10
	cfg.Handler = b.refundHandler(p, refundStep())
	cfg.Retry = consumer.RetryPolicy{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, MaxAttempts: 100}
	r := start(t, cfg)
	waitUntil(t, time.Minute, "every refund booked", func() bool { rows, _ := b.rows(t); return rows >= 10 })
	a.WaitNoLag(t, group, topic)
	r.Stop(t)
	b.requireLedgerMatchesProvider(t, 10)
	p.requireOnce(t, 10)
}

// TestKafkaEffectExhaustedUnknownStaysVisible (39.5): Blocking retries run
// out while a refund's outcome stays unknown (its query lags longer than
// the retries last, and the provider keeps no keys, so it may not be
// repeated). The message is dead-lettered and the step stays unknown,
// listed for operators: it executed once, and nothing forgets it.
func TestKafkaEffectExhaustedUnknownStaysVisible(t *testing.T) {
	brokers, a, topic, group := kafkaTest(t, 1)
	b := newTestBank(t)
	p := newRefundProvider()
	p.timeouts["x-00"] = 1
	p.lagging = true
	producePayments(t, a, topic, 1, "x")

	src := newSource(t, realSourceConfig(t, brokers, topic, group))
	dl := &consumertest.DeadLetters{}
	cfg := b.config(src, dl)
	cfg.Logger = testLogger(t)
	s := refundStep()
	s.KeyTTL, s.ReadBackLag = 0, time.Hour
	cfg.Handler = b.refundHandler(p, s)
	cfg.Retry = consumer.RetryPolicy{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond, MaxAttempts: 3}
	r := start(t, cfg)
	waitUntil(t, time.Minute, "the refund dead-lettered", func() bool { return len(dl.Letters()) >= 1 })
	a.WaitNoLag(t, group, topic)
	r.Stop(t)

	l := dl.Letters()[0]
	if !errors.Is(l.Reason, effect.ErrUnknownOutcome) || l.Cause != consumer.CauseExhausted {
		t.Fatalf("letter %v: %v; want exhausted, the outcome unknown", l.Cause, l.Reason)
	}
	steps, err := b.store.Steps(ctxTimeout(t, 10*time.Second), dedup.StepFilter{})
	if err != nil || len(steps) != 1 || steps[0].State != dedup.StepUnknown || steps[0].Ref.Key != l.Key || steps[0].Attempts != 1 {
		t.Fatalf("unresolved steps %+v (%v); want the letter's step, unknown after 1 attempt", steps, err)
	}
	p.requireOnce(t, 1)
	if rows, _ := b.rows(t); rows != 0 {
		t.Fatalf("%d ledger rows, want none", rows)
	}
}

// TestKafkaEffectKilledMidCallRecordsUnknown (39.10): the consumer is
// killed while a refund's request is in flight (the provider executed
// it; the answer never comes back). The outcome is recorded unknown at
// once — not left pending for a lease to run out — and the next consumer
// reads it back instead of calling again.
func TestKafkaEffectKilledMidCallRecordsUnknown(t *testing.T) {
	brokers, a, topic, group := kafkaTest(t, 1)
	b := newTestBank(t)
	p := newRefundProvider()
	producePayments(t, a, topic, 3, "k")

	inFlight := make(chan struct{})
	var once sync.Once
	run := func(hang bool) *running {
		cfg := b.config(newSource(t, realSourceConfig(t, brokers, topic, group)), &consumertest.DeadLetters{})
		cfg.Logger = testLogger(t)
		cfg.BatchSize = 1
		s := refundStep()
		s.Lease = time.Hour // a holder that dies must not be waited out
		cfg.Handler = b.refundHandler(p, s)
		if hang {
			cfg.Handler = consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				var pay payment
				if err := json.Unmarshal(m.Value, &pay); err != nil {
					return consumer.Permanent(err)
				}
				s := s
				s.Call = func(ctx context.Context, c effect.Call) ([]byte, error) {
					res, err := p.refund(pay.TxnID, pay.Amount, c)
					if pay.TxnID == "k-01" {
						once.Do(func() { close(inFlight) })
						<-ctx.Done() // executed; the answer never comes back
						return nil, ctx.Err()
					}
					return res, err
				}
				s.ReadBack = func(ctx context.Context, c effect.Call) (effect.ReadBack, error) { return p.query(c) }
				res, err := effect.Do(ctx, b.store, m, s)
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `INSERT INTO `+b.table+` (txn_id, amount, source) VALUES ($1, $2::text::bigint, $3)`, pay.TxnID, string(res), m.Coordinates())
				return err
			})
		}
		return start(t, cfg)
	}
	r := run(true)
	<-inFlight
	r.Kill(t)
	rec, ok, err := b.store.Step(ctxTimeout(t, 10*time.Second), dedup.StepRef{Key: dedup.Key{Scope: "payments", ID: "k-01"}, Step: "refund"})
	if err != nil || !ok || rec.State != dedup.StepUnknown {
		t.Fatalf("step of k-01 after the kill: %+v %v %v; want unknown", rec, ok, err)
	}
	r = run(false)
	waitUntil(t, time.Minute, "every refund booked", func() bool { rows, _ := b.rows(t); return rows >= 3 })
	a.WaitNoLag(t, group, topic)
	r.Stop(t)
	b.requireLedgerMatchesProvider(t, 3)
	p.requireOnce(t, 3)
}
