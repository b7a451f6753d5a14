package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestKafkaEntityStaleEventsSmallPool: a pgstore on a pool of 2
// connections, 4 partitions, and in every batch of every partition stale
// events, one of them with a provider step. The steps of stale events are
// read in the batch's transaction: a read on a connection of its own,
// taken while the batch's transaction holds one, left the lanes holding
// the pool's every connection and waiting for another, for good (the
// consumer hung, its transactions idle in transaction). Every event ends
// applied or stale, the one with a step dead-lettered in doubt.
func TestKafkaEntityStaleEventsSmallPool(t *testing.T) {
	const partitions, perPartition, poolSize = 4, 150, 2
	brokers, a, topic, group := kafkaTest(t, partitions)
	big := testenv.Pool(t)
	schema := testenv.Schema(t, big)
	pcfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	app := "idem_" + name(t, "pool")
	pcfg.MaxConns = poolSize
	pcfg.ConnConfig.RuntimeParams["application_name"] = app[:min(len(app), 63)]
	small, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	store := pgtest.Store(t, small, schema)
	ctx := ctxTimeout(t, 3*time.Minute)
	events := pgx.Identifier{schema, "trade_events"}.Sanitize()
	if _, err := big.Exec(ctx, `CREATE TABLE `+events+` (id bigserial PRIMARY KEY, notify_id text NOT NULL UNIQUE)`); err != nil {
		t.Fatal(err)
	}

	// In each partition, trades whose second notification comes first:
	// the first, arriving after it, is stale, in the same batch.
	var msgs []kafkago.Message
	for p := range partitions {
		for i := range perPartition {
			trade := fmt.Sprintf("P%d-T%04d", p, i)
			for _, seq := range []int64{2, 1} {
				n := tradeNotify{NotifyID: fmt.Sprintf("%s-%d", trade, seq), TradeNo: trade, Status: "TRADE_SUCCESS", Seq: seq}
				v, _ := json.Marshal(n)
				msgs = append(msgs, kafkago.Message{Partition: p, Key: []byte(trade), Value: v})
			}
		}
	}
	// An earlier, rolled-back attempt of one stale notification called a
	// provider: its step succeeded, and nothing books it.
	inDoubt := dedup.StepRef{Key: dedup.Key{Scope: "alipay", ID: "P2-T0007-1"}, Step: "refund"}
	rec, err := store.BeginStep(ctx, inDoubt, "pk-refund", dedup.Fingerprint{}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.FinishStep(ctx, inDoubt, rec.Token, dedup.StepOutcome{State: dedup.StepSucceeded}); err != nil {
		t.Fatal(err)
	}
	a.Produce(t, topic, msgs...)

	dl := &consumertest.DeadLetters{}
	r := start(t, consumer.Config[pgx.Tx]{
		Name: "alipay", Source: newSource(t, realSourceConfig(t, brokers, topic, group)), Store: store, DeadLetter: dl,
		Logger: testLogger(t), Key: consumer.ByJSONField("notify_id"), Entity: byTrade, BatchSize: 20,
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			id, err := consumer.ByJSONField("notify_id")(m)
			if err != nil {
				return consumer.Permanent(err)
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+events+` (notify_id) VALUES ($1)`, id)
			return err
		}),
	})
	count := func(q string, args ...any) int {
		var n int
		if err := big.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	total := partitions * perPartition * 2
	testenv.WaitUntilProgress(t, time.Minute, "every notification applied or stale", func() (bool, string) {
		settled := count(`SELECT count(*) FROM `+events) + int(r.Stats().Stale) + len(dl.Letters())
		idle := count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'`, pcfg.ConnConfig.RuntimeParams["application_name"])
		return settled >= total, fmt.Sprintf("%d of %d notifications settled; %d of the pool's %d connections idle in transaction", settled, total, idle, poolSize)
	})
	a.WaitNoLag(t, group, topic)
	r.Stop(t)

	stale := partitions * perPartition
	if n := count(`SELECT count(*) FROM ` + events); n != total-stale {
		t.Errorf("%d notifications applied, want the %d second ones", n, total-stale)
	}
	if n := count(`SELECT count(*) FROM ` + events + ` WHERE notify_id LIKE '%-1'`); n != 0 {
		t.Errorf("%d stale notifications applied", n)
	}
	letters := dl.Letters()
	if len(letters) != 1 || letters[0].Key != inDoubt.Key || letters[0].Cause != consumer.CauseInDoubt {
		t.Fatalf("%d letters %v, want %s's alone, in doubt", len(letters), letters, inDoubt.Key)
	}
	if got := r.Stats().Stale; got != int64(stale-1) {
		t.Errorf("Stats.Stale %d, want %d", got, stale-1)
	}
}
