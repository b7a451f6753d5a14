package main

import (
	"bytes"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
	"github.com/idemkit/idem/internal/testenv/relaytest"
	"github.com/idemkit/idem/outbox"
)

// The command links the RocketMQ client, whose request cache starts a
// package-level janitor.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.RocketMQClientLeaks...) }

// TestRelayToKafka runs the command against the test environment: it
// migrates, publishes what was enqueued, and stops cleanly on SIGTERM.
func TestRelayToKafka(t *testing.T) {
	k := relaytest.NewKafka(t, testenv.KafkaBrokers(t))
	topic := testenv.Name(t, "t")
	k.CreateTopic(t, topic, 1, nil)
	pool, schema := testenv.SchemaPool(t)
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"-postgres", testenv.PostgresURL(t), "-schema", schema, "-kafka", strings.Join(k.Brokers, ","),
			"-migrate", "-poll", "5ms"}, &out)
	}()
	ctx := testenv.Context(t, time.Minute)
	testenv.WaitUntilProgress(t, time.Minute, "the command migrated the outbox", func() (bool, string) { return ob.Check(ctx) == nil, "" })
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var msgs []outbox.Message
		for i := range 10 {
			msgs = append(msgs, outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte(fmt.Sprintf("k %d", i))})
		}
		return ob.EnqueueFor(ctx, tx, dedup.Key{Scope: "s", ID: "1"}, msgs...)
	}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntilProgress(t, time.Minute, "the outbox drained", func() (bool, string) { return relaytest.Pending(t, pool, ob) == 0, "" })
	var got []relaytest.Delivered
	for _, m := range k.ReadAll(t, topic) {
		got = append(got, relaytest.Delivered{ID: kafkatest.Header(m, outbox.HeaderID), Key: string(m.Key), Value: string(m.Value)})
	}
	relaytest.CheckKeyOrder(t, got, 10)
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("no stop a minute after SIGTERM:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "published=10") {
		t.Fatalf("the command's log does not say it published 10:\n%s", out.String())
	}
}
