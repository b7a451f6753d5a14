package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
)

// The consumer with Config.Offsets (offsets in the store) against real
// Postgres: every message applied once, counted on the effects table.

// countEffects returns the effect rows and their distinct txn_ids.
func countEffects(t *testing.T, pool *pgxpool.Pool, table string) (rows, distinct int64) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT txn_id) FROM `+table).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// storedOffsets returns the offsets rows of scope and topic.
func storedOffsets(t *testing.T, st *pgstore.Store, scope, topic string) map[int32]int64 {
	t.Helper()
	got, err := st.NextOffsets(context.Background(), scope, topic)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func paymentMsgs(topic string, parts, n int, from int) []*consumer.Message {
	var msgs []*consumer.Message
	for i := from; i < from+n; i++ {
		msgs = append(msgs, consumertest.Message(topic, int32(i%parts), int64(i/parts), "",
			fmt.Sprintf(`{"txn_id":"T%05d","amount":%d}`, i, 100+i)))
	}
	return msgs
}

// TestOffsetsRedeliveriesAndLostAcksApplyOnce: 1,000 messages on four
// partitions, each delivered 2–4 times, with every third ack lost after the
// commit (a crash between the database commit and the broker's), keyed by
// offset alone: one effect each, no key rows, and each partition's next
// offset past its last message.
func TestOffsetsRedeliveriesAndLostAcksApplyOnce(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	const n, parts = 1000, 4
	res := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name:      "payments",
		Store:     st,
		Offsets:   st,
		Handler:   insertEffect(table),
		BatchSize: 50,
		Logger:    quiet,
	}, consumertest.Script{MinDeliveries: 2, MaxDeliveries: 4, CrashAfterCommitEvery: 3, Seed: 11}, paymentMsgs("payments", parts, n, 0)...)
	t.Log(res)

	if rows, distinct := countEffects(t, pool, table); rows != n || distinct != n {
		t.Fatalf("effects %d (distinct %d), want %d", rows, distinct, n)
	}
	var keyRows int64
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+st.Table()).Scan(&keyRows); err != nil {
		t.Fatal(err)
	}
	if keyRows != 0 {
		t.Errorf("%d key rows, want none: offsets alone", keyRows)
	}
	want := map[int32]int64{0: n / parts, 1: n / parts, 2: n / parts, 3: n / parts}
	if got := storedOffsets(t, st, "payments", "payments"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("stored offsets %v, want %v", got, want)
	}
	if res.Source.Deliveries < 2*n || res.Source.Crashes == 0 {
		t.Fatalf("the script did not misbehave enough: %+v", res.Source)
	}
	if res.Stats.Applied != n || res.Stats.Duplicates != int64(res.Source.Deliveries-n) || len(res.DeadLetters) != 0 {
		t.Fatalf("stats %+v, %d dead letters", res.Stats, len(res.DeadLetters))
	}
	if res.Stats.Commits > int64(res.Source.AckCalls) {
		t.Errorf("%d commits for %d batches", res.Stats.Commits, res.Source.AckCalls)
	}

	// A second consumer of the same name, redelivered everything (a new
	// process starting from an old broker offset), applies nothing.
	again := consumertest.Run(t, consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Offsets: st, Handler: insertEffect(table), Logger: quiet,
	}, consumertest.Script{}, paymentMsgs("payments", parts, n, 0)...)
	if again.Stats.Applied != 0 || again.Stats.Duplicates != n {
		t.Fatalf("redelivered to a new consumer: %v", again)
	}
	if rows, _ := countEffects(t, pool, table); rows != n {
		t.Fatalf("effects %d after the redelivery, want %d", rows, n)
	}
}

// TestOffsetsWithBusinessKeys: offsets catch the broker's redeliveries, the
// key table the producer's re-sends (one payment at two offsets) and a
// re-send with another payload (dead-lettered, and the offset moves past
// it, so its redelivery is not dead-lettered again).
func TestOffsetsWithBusinessKeys(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	ctx := context.Background()
	var msgs []*consumer.Message
	const payments = 200
	for i := range 2 * payments { // every payment twice, the second at a later offset
		id := i % payments
		msgs = append(msgs, consumertest.Message("payments", int32(id%2), int64(i/2), "",
			fmt.Sprintf(`{"txn_id":"P%04d","amount":%d}`, id, 100+id)))
	}
	// A re-send of P0001 with another amount, the last message of partition 1.
	bad := consumertest.Message("payments", 1, payments, "", `{"txn_id":"P0001","amount":1}`)
	msgs = append(msgs, bad)
	cfg := consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Offsets: st, Key: consumer.ByJSONField("txn_id"),
		Handler: insertEffect(table), BatchSize: 25, Logger: quiet,
	}
	res := consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 3, CrashAfterCommitEvery: 4, Seed: 5}, msgs...)
	t.Log(res)
	if rows, distinct := countEffects(t, pool, table); rows != payments || distinct != payments {
		t.Fatalf("effects %d (distinct %d), want %d", rows, distinct, payments)
	}
	var keyRows int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+st.Table()).Scan(&keyRows); err != nil {
		t.Fatal(err)
	}
	if keyRows != payments {
		t.Errorf("%d key rows, want %d: one per business key", keyRows, payments)
	}
	if res.Stats.Applied != payments {
		t.Errorf("applied %d, want %d", res.Stats.Applied, payments)
	}
	if len(res.DeadLetters) < 1 || !errors.Is(res.DeadLetters[0].Reason, dedup.ErrFingerprintMismatch) {
		t.Fatalf("dead letters %+v, want the mismatching re-send", res.DeadLetters)
	}
	if got := storedOffsets(t, st, "payments", "payments"); got[0] != payments || got[1] != payments+1 {
		t.Fatalf("stored offsets %v, want map[0:%d 1:%d] (past the dead letter)", got, payments, payments+1)
	}
	again := consumertest.Run(t, cfg, consumertest.Script{}, bad)
	if again.Stats.Duplicates != 1 || len(again.DeadLetters) != 0 {
		t.Fatalf("the dead letter's redelivery: %v, letters %+v; want a duplicate", again, again.DeadLetters)
	}
}

// TestOffsetsDeadLetterAdvances: a message dead-lettered for a permanent
// handler error, the last of its partition, moves the next offset past it
// once its letter is written, and its redelivery is a duplicate.
func TestOffsetsDeadLetterAdvances(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	effect := insertEffect(table)
	cfg := consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Offsets: st, Logger: quiet,
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.Offset == 9 {
				return consumer.Permanent(errors.New("account closed"))
			}
			return effect(ctx, tx, m)
		}),
	}
	msgs := paymentMsgs("payments", 1, 10, 0)
	res := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	if len(res.DeadLetters) != 1 || res.DeadLetters[0].Message.Offset != 9 || res.Stats.Applied != 9 {
		t.Fatalf("%v, letters %+v", res, res.DeadLetters)
	}
	if got := storedOffsets(t, st, "payments", "payments"); got[0] != 10 {
		t.Fatalf("stored offsets %v, want 0:10", got)
	}
	again := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	if again.Stats.Duplicates != 10 || len(again.DeadLetters) != 0 {
		t.Fatalf("redelivered: %v, letters %+v", again, again.DeadLetters)
	}
	if rows, _ := countEffects(t, pool, table); rows != 9 {
		t.Fatalf("effects %d, want 9", rows)
	}
}

// TestOffsetsLetterMovesTheOffsetAtOnce: with offsets alone, a batch's
// first message is dead-lettered and the process dies before the batch's
// next message commits (its handler still running). The letter exists from
// then on: the operator fixes the cause and redrives it, and the restart
// redelivers the batch. The original, which writes no key row, must be a
// duplicate by then, or it is applied beside the copy claimed under its
// identity: the offset moves past a letter as soon as it is written, not
// when the rest of its batch settles.
func TestOffsetsLetterMovesTheOffsetAtOnce(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	effect := insertEffect(table)
	var broken atomic.Bool // the account's cause, fixed before the redrive
	broken.Store(true)
	entered := make(chan struct{})
	var once sync.Once
	cfg := consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Offsets: st, Logger: quiet,
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			switch {
			case m.Offset == 0 && broken.Load():
				return consumer.Permanent(errors.New("account closed"))
			case m.Offset == 1 && broken.Load(): // the process dies with it in the handler
				once.Do(func() { close(entered) })
				<-ctx.Done()
				return ctx.Err()
			}
			return effect(ctx, tx, m)
		}),
	}
	msgs := paymentMsgs("payments", 1, 2, 0)

	letters := &consumertest.DeadLetters{}
	src := consumertest.NewSource(consumertest.Script{})
	first := cfg
	first.Source, first.DeadLetter, first.Clock = src, letters, consumertest.NewClock()
	first.BatchSize, first.BatchWait = 2, time.Minute // both messages in one batch
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runCtx, crash := context.WithCancel(ctx)
	_, done := running(t, runCtx, first)
	src.Push(msgs...)
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("consumer stopped: %v", err)
	case <-ctx.Done():
		t.Fatal("the batch's second message never reached its handler")
	}
	if n := len(letters.Letters()); n != 1 {
		t.Fatalf("%d letters before the crash, want the first message's", n)
	}
	crash()
	<-done
	if got := storedOffsets(t, st, "payments", "payments"); got[0] != 1 {
		t.Errorf("stored offsets %v after the crash, want 0:1: past the letter written", got)
	}

	// The operator fixes the cause and redrives the letter: its copy lies
	// at offset 2 with the original's lineage. The restart redelivers the
	// batch from wherever the broker's offset was.
	broken.Store(false)
	l := letters.Letters()[0]
	cp := consumertest.Message("payments", 0, 2, "", string(l.Message.Value))
	cp.Headers = []consumer.Header{
		{Key: wire.MetaTopic, Value: []byte("payments")}, {Key: wire.MetaPartition, Value: []byte("0")},
		{Key: wire.MetaOffset, Value: []byte("0")}, {Key: wire.MetaMessageID, Value: []byte(l.Message.ID)},
		{Key: wire.MetaKeyScope, Value: []byte(l.Key.Scope)}, {Key: wire.MetaKey, Value: []byte(l.Key.ID)},
		{Key: wire.MetaRedriveCount, Value: []byte("1")}, {Key: wire.MetaRedrivenFrom, Value: []byte("payments.dlq/0/0")},
	}
	again := consumertest.Run(t, cfg, consumertest.Script{}, append(paymentMsgs("payments", 1, 2, 0), cp)...)
	var applied int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE txn_id = 'T00000'`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	if applied != 1 {
		t.Fatalf("payment T00000 applied %d times, want once (the redriven copy, or its original): %v", applied, again)
	}
	if rows, distinct := countEffects(t, pool, table); rows != 2 || distinct != 2 {
		t.Fatalf("effects %d (distinct %d), want 2", rows, distinct)
	}
}

// TestOffsetsZombieRefused: consumer Z applies offsets 0–49 of a partition
// and then loses it without knowing (a zombie). Consumer B, its new owner,
// applies 0–99. Z is then delivered 50–99 by its stale fetcher: its
// compare-and-set from 50 is refused, its batch rolls back, and on retry it
// reads 100 and skips them. Every payment is applied once.
func TestOffsetsZombieRefused(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	msgs := paymentMsgs("payments", 1, 100, 0)
	cfg := func(src *consumertest.Source) consumer.Config[pgx.Tx] {
		return consumer.Config[pgx.Tx]{
			Name: "payments", Store: st, Offsets: st, Handler: insertEffect(table),
			Source: src, DeadLetter: &consumertest.DeadLetters{}, Clock: consumertest.NewClock(), Logger: quiet,
		}
	}
	zsrc := consumertest.NewSource(consumertest.Script{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	zombie, zdone := running(t, ctx, cfg(zsrc))
	zsrc.Push(msgs[:50]...)
	if err := zsrc.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}

	owner := consumertest.Run(t, cfg(consumertest.NewSource(consumertest.Script{})), consumertest.Script{}, msgs...)
	if owner.Stats.Applied != 50 || owner.Stats.Duplicates != 50 {
		t.Fatalf("new owner: %v; want 50 applied (50–99), 50 duplicates", owner)
	}

	zsrc.Push(msgs[50:]...)
	drain(t, ctx, zombie, zdone, zsrc)
	zs := zombie.Stats()
	if zs.Applied != 50 || zs.Duplicates != 50 {
		t.Fatalf("zombie: %+v; want 50 applied, 50 duplicates", zs)
	}
	if zs.Retries < 1 {
		t.Fatalf("zombie: %+v; want its stale compare-and-set refused and retried", zs)
	}
	if rows, distinct := countEffects(t, pool, table); rows != 100 || distinct != 100 {
		t.Fatalf("effects %d (distinct %d), want 100", rows, distinct)
	}
	if got := storedOffsets(t, st, "payments", "payments"); got[0] != 100 {
		t.Fatalf("stored offsets %v, want 0:100", got)
	}
}

// TestOffsetsTwoOwnersRace: two consumers are delivered the same partitions
// at once (both believe they own them), each message several times; the
// row lock and the compare-and-set let each offset apply once.
func TestOffsetsTwoOwnersRace(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{LockTimeout: 30 * time.Second})
	const n = 600
	var wg sync.WaitGroup
	results := make([]consumertest.Result, 2)
	for i := range 2 {
		wg.Go(func() {
			results[i] = consumertest.Run(t, consumer.Config[pgx.Tx]{
				Name: "payments", Store: st, Offsets: st, Handler: insertEffect(table), BatchSize: 20, Logger: quiet,
			}, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 2, Seed: uint64(i + 1)}, paymentMsgs("payments", 3, n, 0)...)
		})
	}
	wg.Wait()
	t.Log(results[0], results[1])
	if rows, distinct := countEffects(t, pool, table); rows != n || distinct != n {
		t.Fatalf("effects %d (distinct %d), want %d", rows, distinct, n)
	}
	if applied := results[0].Stats.Applied + results[1].Stats.Applied; applied != n {
		t.Fatalf("applied %d in all, want %d", applied, n)
	}
}

// TestOffsetsAheadOfLog: a stored next offset past the log's end (the topic
// was deleted and created again) stops the consumer with
// dedup.ErrOffsetsAhead; nothing is applied or acknowledged.
func TestOffsetsAheadOfLog(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	cfg := consumer.Config[pgx.Tx]{Name: "payments", Store: st, Offsets: st, Handler: insertEffect(table), Logger: quiet}
	consumertest.Run(t, cfg, consumertest.Script{}, paymentMsgs("payments", 1, 50, 0)...)

	// The new log: offsets from 0 again, its end at 10.
	var reborn []*consumer.Message
	for _, m := range paymentMsgs("payments", 1, 10, 1000) {
		m.Offset -= 1000
		m.ID = m.Coordinates()
		m.LogEnd = 10
		reborn = append(reborn, m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := consumertest.Drive(ctx, cfg, consumertest.Script{}, reborn...)
	if !errors.Is(err, dedup.ErrOffsetsAhead) {
		t.Fatalf("Drive: %v; want ErrOffsetsAhead", err)
	}
	t.Log(err)
	if res.Stats.Applied != 0 || res.Stats.Duplicates != 0 || res.Source.Acked != 0 {
		t.Fatalf("%v, %d acked; want nothing applied, skipped or acknowledged", res, res.Source.Acked)
	}
	// The operator resets the topic's offsets: the new log applies.
	if n, err := st.ResetOffsets(ctx, "payments", "payments"); err != nil || n != 1 {
		t.Fatalf("ResetOffsets: %d, %v", n, err)
	}
	res = consumertest.Run(t, cfg, consumertest.Script{}, reborn...)
	if res.Stats.Applied != 10 {
		t.Fatalf("after the reset: %v; want 10 applied", res)
	}
	if rows, _ := countEffects(t, pool, table); rows != 60 {
		t.Fatalf("effects %d, want 60", rows)
	}
}

// TestOffsetsStaleLogEndIsNotAhead: a message whose end of log is older
// than the message itself (a high watermark read before the record was,
// seen under a live producer: the record at 14127 came with an end of
// 14092) is not a stored offset ahead of the log: the log reaches past
// every message fetched from it. It is applied; the consumer goes on.
func TestOffsetsStaleLogEndIsNotAhead(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	cfg := consumer.Config[pgx.Tx]{Name: "payments", Store: st, Offsets: st, Handler: insertEffect(table), Logger: quiet}
	consumertest.Run(t, cfg, consumertest.Script{}, paymentMsgs("payments", 1, 50, 0)...)

	more := paymentMsgs("payments", 1, 10, 50) // offsets 50..59, the store's next offset 50
	for _, m := range more {
		m.LogEnd = 40 // read before the records were
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := consumertest.Drive(ctx, cfg, consumertest.Script{}, more...)
	if err != nil || res.Stats.Applied != 10 {
		t.Fatalf("Drive: %v, %v; want the 10 messages applied, not the stored offset taken for one past the log's end", res, err)
	}
	if rows, _ := countEffects(t, pool, table); rows != 60 {
		t.Fatalf("effects %d, want 60", rows)
	}
}

// unassigned is a consumertest.Source whose messages all belong to an
// assignment that ended (source.Description.Assigned).
type unassigned struct{ *consumertest.Source }

func (s unassigned) Describe() source.Description {
	d := s.Source.Describe()
	d.Assigned = func(*consumer.Message) bool { return false }
	return d
}

// runStale runs a consumer of cfg (whose Source wraps inner) over stale
// messages until inner is idle, stops it, and returns its stats; Run must
// end without an error (not ErrOffsetsAhead).
func runStale(t *testing.T, cfg consumer.Config[pgx.Tx], inner *consumertest.Source, stale []*consumer.Message) consumer.Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cons, done := running(t, ctx, cfg)
	inner.Push(stale...)
	drain(t, ctx, cons, done, inner) // Run ends without ErrOffsetsAhead: the stale messages skipped
	return cons.Stats()
}

// running starts a consumer of cfg; Run's result arrives on the channel.
func running(t *testing.T, ctx context.Context, cfg consumer.Config[pgx.Tx]) (*consumer.Consumer[pgx.Tx], <-chan error) {
	t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return c, done
}

// drain waits until src has no message in flight, stops c gracefully and
// wants its Run to end without an error.
func drain(t *testing.T, ctx context.Context, c *consumer.Consumer[pgx.Tx], done <-chan error, src interface {
	WaitIdle(ctx context.Context) error
}) {
	t.Helper()
	if err := src.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestOffsetsStaleLaneNotAhead: a lane still holding messages of an
// assignment that ended, fetched before the partition's new owner moved its
// offset past their log end, skips them as duplicates: the new owner's
// offset is no sign of a recreated topic.
func TestOffsetsStaleLaneNotAhead(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	cfg := consumer.Config[pgx.Tx]{Name: "payments", Store: st, Offsets: st, Handler: insertEffect(table), Logger: quiet}
	consumertest.Run(t, cfg, consumertest.Script{}, paymentMsgs("payments", 1, 50, 0)...)

	stale := paymentMsgs("payments", 1, 10, 0)
	for _, m := range stale {
		m.LogEnd = 10 // fetched when the log ended at 10
	}
	inner := consumertest.NewSource(consumertest.Script{})
	cfg.Source, cfg.DeadLetter, cfg.Clock = unassigned{inner}, &consumertest.DeadLetters{}, consumertest.NewClock()
	if s := runStale(t, cfg, inner, stale); s.Duplicates != 10 || s.Applied != 0 {
		t.Fatalf("%+v; want 10 duplicates", s)
	}
	if rows, _ := countEffects(t, pool, table); rows != 50 {
		t.Fatalf("effects %d, want 50", rows)
	}
}

// TestOffsetsHeldBackAtARefusedMessage: a re-send whose business key
// mismatches sits mid-batch; its dead letter is written after the batch
// commits, and the consumer is stopped hard before that happens (the sink
// is down: a crash between the commit and the letter). The committed next
// offset must stop at the refused message, so that the next consumer is
// redelivered it and dead-letters it, instead of skipping it as settled.
func TestOffsetsHeldBackAtARefusedMessage(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	msgs := paymentMsgs("payments", 1, 10, 0)
	msgs[4] = consumertest.Message("payments", 0, 4, "", `{"txn_id":"T00001","amount":1}`) // T00001 again, another amount
	cfg := consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Offsets: st, Key: consumer.ByJSONField("txn_id"),
		Handler: insertEffect(table), BatchSize: 10, Logger: quiet,
	}

	var letterTried atomic.Bool
	down := consumer.DeadLetterFunc(func(ctx context.Context, l consumer.Letter) error {
		letterTried.Store(true)
		return errors.New("dead-letter topic unreachable")
	})
	src := consumertest.NewSource(consumertest.Script{})
	first := cfg
	first.Source, first.DeadLetter, first.Clock = src, down, consumertest.NewClock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, done := running(t, ctx, first)
	src.Push(msgs...)
	// However the lane cut its batches, the re-send's letter is tried only
	// after the batch holding it committed; the lane then retries the letter
	// and goes no further.
	for !letterTried.Load() {
		select {
		case err := <-done:
			t.Fatalf("consumer stopped: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	stopCtx, stopCancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stopCancel()
	_ = c.Stop(stopCtx) // hard: the letter never written
	<-done
	if got := storedOffsets(t, st, "payments", "payments"); got[0] != 4 {
		t.Fatalf("stored offsets %v after the batch, want 0:4 (held at the refused re-send)", got)
	}
	if rows, _ := countEffects(t, pool, table); rows < 4 {
		t.Fatalf("effects %d before the stop, want at least offsets 0-3", rows)
	}

	again := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	if len(again.DeadLetters) != 1 || again.DeadLetters[0].Message.Offset != 4 ||
		!errors.Is(again.DeadLetters[0].Reason, dedup.ErrFingerprintMismatch) {
		t.Fatalf("redelivered: %v, letters %+v; want the re-send dead-lettered", again, again.DeadLetters)
	}
	if rows, distinct := countEffects(t, pool, table); rows != 9 || distinct != 9 {
		t.Fatalf("effects %d (distinct %d), want 9", rows, distinct)
	}
	if got := storedOffsets(t, st, "payments", "payments"); got[0] != 10 {
		t.Fatalf("stored offsets %v, want 0:10", got)
	}
}

// TestOffsetsReleasedComeBackFirst: consumer A stops hard with a batch in
// its handler; the messages it released come back to consumer B ahead of
// the later ones (as a broker resumes from the first unacknowledged
// offset), so B neither skips them nor applies anything twice.
func TestOffsetsReleasedComeBackFirst(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	effect := insertEffect(table)
	blocked := make(chan struct{})
	var once sync.Once
	cfg := consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Offsets: st, BatchSize: 5, Logger: quiet,
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.Offset == 5 && m.Attempt == 1 {
				once.Do(func() { close(blocked) })
				<-ctx.Done() // until the hard stop
				return ctx.Err()
			}
			return effect(ctx, tx, m)
		}),
	}
	src := consumertest.NewSource(consumertest.Script{})
	a := cfg
	a.Source, a.DeadLetter, a.Clock = src, &consumertest.DeadLetters{}, consumertest.NewClock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ca, done := running(t, ctx, a)
	src.Push(paymentMsgs("payments", 1, 30, 0)...)
	select {
	case <-blocked:
	case err := <-done:
		t.Fatalf("consumer A stopped: %v", err)
	}
	stopCtx, stopCancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer stopCancel()
	_ = ca.Stop(stopCtx)
	<-done

	b := cfg
	b.Source, b.DeadLetter = src, &consumertest.DeadLetters{}
	res := consumertest.Run(t, b, consumertest.Script{})
	t.Log(res)
	if rows, distinct := countEffects(t, pool, table); rows != 30 || distinct != 30 {
		t.Fatalf("effects %d (distinct %d), want 30: released messages skipped or applied twice", rows, distinct)
	}
	if got := storedOffsets(t, st, "payments", "payments"); got[0] != 30 {
		t.Fatalf("stored offsets %v, want 0:30", got)
	}
}

// assignedFor is a consumertest.Source whose member holds its partitions
// for the first n questions, then learns it lost them (a zombie noticing
// at its next heartbeat).
type assignedFor struct {
	*consumertest.Source
	mu sync.Mutex
	n  int
}

func (s *assignedFor) Describe() source.Description {
	d := s.Source.Describe()
	d.Assigned = s.assigned
	return d
}

func (s *assignedFor) assigned(*consumer.Message) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n--
	return s.n >= 0
}

// TestOffsetsAheadWhileAZombieLearns: a member still believes it holds a
// partition whose new owner moved the stored offset past the log end the
// member's messages were fetched with. It waits (retrying, as a conflict)
// instead of stopping with ErrOffsetsAhead, and once it learns it lost the
// partition it skips them as duplicates.
func TestOffsetsAheadWhileAZombieLearns(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	cfg := consumer.Config[pgx.Tx]{Name: "payments", Store: st, Offsets: st, Handler: insertEffect(table), Logger: quiet}
	consumertest.Run(t, cfg, consumertest.Script{}, paymentMsgs("payments", 1, 50, 0)...)

	stale := paymentMsgs("payments", 1, 10, 0)
	for _, m := range stale {
		m.LogEnd = 10
	}
	inner := consumertest.NewSource(consumertest.Script{})
	cfg.Source, cfg.DeadLetter, cfg.Clock = &assignedFor{Source: inner, n: 3}, &consumertest.DeadLetters{}, consumertest.NewClock()
	if s := runStale(t, cfg, inner, stale); s.Duplicates != 10 || s.Applied != 0 || s.Retries < 1 {
		t.Fatalf("%+v; want 10 duplicates after at least one retry", s)
	}
	if rows, _ := countEffects(t, pool, table); rows != 50 {
		t.Fatalf("effects %d, want 50", rows)
	}
}

// TestOffsetsZombieFencedAtARefusedMessage (issue 25, item 8a): a batch
// whose first new message is refused by its business key moves no offset,
// yet it decides from the lane's cursor — dead-letters the refused message
// after the commit and applies the messages after it. Consumer Z applies
// offset 0 and loses the partition without knowing; the new owner settles
// 0–2 (the re-send at 1 dead-lettered, T00002 applied), and T00002's key
// row is purged (its retention ran out). Z is then delivered 1–2 by its
// stale fetcher: its transaction must be fenced as a move is — refused,
// retried from the stored offset, and everything skipped — rather than
// dead-letter the re-send a second time and apply T00002 again.
func TestOffsetsZombieFencedAtARefusedMessage(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs := []*consumer.Message{
		consumertest.Message("payments", 0, 0, "", `{"txn_id":"T00000","amount":100}`),
		consumertest.Message("payments", 0, 1, "", `{"txn_id":"T00000","amount":1}`), // a re-send, another amount
		consumertest.Message("payments", 0, 2, "", `{"txn_id":"T00002","amount":102}`),
	}
	cfg := consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Offsets: st, Key: consumer.ByJSONField("txn_id"), Handler: insertEffect(table),
		BatchSize: 10, Clock: consumertest.NewClock(), Logger: quiet,
	}
	zsrc, zletters := consumertest.NewSource(consumertest.Script{}), &consumertest.DeadLetters{}
	zcfg := cfg
	zcfg.Source, zcfg.DeadLetter = zsrc, zletters
	zombie, zdone := running(t, ctx, zcfg)
	zsrc.Push(msgs[0])
	if err := zsrc.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}

	owner := consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	if owner.Stats.Applied != 1 || len(owner.DeadLetters) != 1 || owner.DeadLetters[0].Message.Offset != 1 {
		t.Fatalf("new owner: %v, letters %+v; want T00002 applied and the re-send dead-lettered", owner, owner.DeadLetters)
	}
	if got := storedOffsets(t, st, "payments", "payments"); got[0] != 3 {
		t.Fatalf("stored offsets %v after the owner, want 0:3", got)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+st.Table()+` SET expires_at = now() - interval '1 second' WHERE key = 'T00002'`); err != nil {
		t.Fatal(err)
	}
	if n, err := st.Purge(ctx, 100); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v; want T00002's key row purged", n, err)
	}

	zsrc.Push(msgs[1:]...)
	drain(t, ctx, zombie, zdone, zsrc)
	if rows, distinct := countEffects(t, pool, table); rows != 2 || distinct != 2 {
		t.Fatalf("effects %d (distinct %d), want 2: the zombie applied a payment again (zombie %+v)", rows, distinct, zombie.Stats())
	}
	if letters := zletters.Letters(); len(letters) != 0 {
		t.Fatalf("the zombie dead-lettered %d messages again (first: offset %d), want none", len(letters), letters[0].Message.Offset)
	}
	if zs := zombie.Stats(); zs.Duplicates != 2 || zs.Retries < 1 {
		t.Fatalf("zombie: %+v; want its stale transaction refused, retried, and both messages skipped", zs)
	}
}

// TestOffsetsAdvancePastStopsOnAPermanentError (issue 25, item 8b): the
// move of the next offset past a dead-lettered message fails for good (a
// constraint of the offsets table refuses every row: class 23, which
// retrying cannot mend). The consumer stops with that error instead of
// retrying it for ever.
func TestOffsetsAdvancePastStopsOnAPermanentError(t *testing.T) {
	pool, _, st, table := effectsRig(t, pgstore.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `ALTER TABLE `+st.OffsetsTable()+` ADD CONSTRAINT refuse_all CHECK (next_offset < 0) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	src := consumertest.NewSource(consumertest.Script{})
	c, done := running(t, ctx, consumer.Config[pgx.Tx]{
		Name: "payments", Store: st, Offsets: st, Key: consumer.ByJSONField("txn_id"), Handler: insertEffect(table),
		Source: src, DeadLetter: &consumertest.DeadLetters{}, Clock: consumertest.NewClock(), Logger: quiet,
	})
	src.Push(consumertest.Message("payments", 0, 0, "", `{"amount":1}`)) // no txn_id: bad input, dead-lettered
	select {
	case err := <-done:
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || !strings.Contains(err.Error(), "dead-lettered") {
			t.Fatalf("Run: %v; want the check violation of the offsets table, naming the dead-lettered message", err)
		}
	case <-time.After(30 * time.Second):
		_ = c.Stop(ctx)
		<-done
		t.Fatalf("the consumer still retries a permanent error after 30s (%d retries)", c.Stats().Retries)
	}
}
