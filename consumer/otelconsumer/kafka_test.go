package otelconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/otelconsumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestKafkaPostgres runs a scripted stream through Kafka into Postgres:
// 20 payments, 6 re-sent, one the handler refuses, one without a key, each
// produced under a producer span whose traceparent travels in its headers.
// The metrics' names, attributes and values equal the consumer's Stats;
// the trace has a batch span linked to the producers, transactions under
// it with their claim and commit; the dead letters carry the trace context
// of their dead-letter spans.
func TestKafkaPostgres(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	pool, schema := testenv.SchemaPool(t)
	ctx := context.Background()
	suffix := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())
	topic, dlq, group := "otel-"+suffix, "otel-"+suffix+".dlq", "otel-"+suffix
	tr := &kafkago.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 30 * time.Second, Transport: tr}
	created, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{
		{Topic: topic, NumPartitions: 2, ReplicationFactor: 1}, {Topic: dlq, NumPartitions: 1, ReplicationFactor: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range created.Errors {
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (txn_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}

	s := newSDK(t)
	producers := map[trace.SpanID]bool{}
	var msgs []kafkago.Message
	add := func(key, value string) {
		var hs []consumer.Header
		h, sc := traceparent(s.tp)
		hs = append(hs, h)
		producers[sc.SpanID()] = true
		msgs = append(msgs, kafkago.Message{Key: []byte(key), Value: []byte(value), Headers: []kafkago.Header{{Key: hs[0].Key, Value: hs[0].Value}}})
	}
	for i := range 20 {
		add(strconv.Itoa(i), payment(i))
	}
	for i := range 6 {
		add(strconv.Itoa(i), payment(i)) // re-sent: duplicates
	}
	add("x", `{"amount":1}`) // no key
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: topic, Balancer: &kafkago.Hash{}, RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, Transport: tr}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	w.Close()

	// No System, no Group, no wrapped sink: the Source says what it is, and
	// the consumer writes its letters through the Telemetry.
	tel, err := otelconsumer.New(otelconsumer.Config{MeterProvider: s.mp, TracerProvider: s.tp})
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, pool, schema)
	src, err := kafka.New(kafka.Config{Brokers: brokers, Topics: []string{topic}, Group: group, DeadLetterTopic: dlq, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name: "payments", Source: src, Store: store, Key: consumer.ByJSONField("txn_id"), Logger: testenv.Logger(t),
		Observer: tel, DeadLetter: src,
		Handler: consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			id, err := consumer.ByJSONField("txn_id")(m)
			if err != nil {
				return consumer.Permanent(err)
			}
			if id == "T00013" {
				return consumer.Permanent(errors.New("account closed"))
			}
			_, err = tx.Exec(ctx, `INSERT INTO ledger VALUES ($1)`, id)
			return err
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tel.Observe(c, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(90 * time.Second)
	for st := c.Stats(); st.Applied+st.Duplicates+st.DeadLettered < int64(len(msgs)); st = c.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("not settled within 90s: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Applied != 19 || st.Duplicates < 6 || st.DeadLettered < 2 {
		t.Fatalf("stats %+v", st)
	}

	ms := s.metrics(t)
	base := []attribute.KeyValue{attribute.String("messaging.system", "kafka"), attribute.String("messaging.destination.name", topic),
		attribute.String("messaging.consumer.group.name", group), attribute.String("idem.consumer.name", "payments")}
	countsAgree(t, ms, st, base...)
	for name, want := range map[string]int64{"idem.consumer.released": st.Released, "idem.consumer.retries": st.Retries} {
		if got := total(t, ms, name, base...); got != want {
			t.Errorf("%s = %d, Stats say %d", name, got, want)
		}
	}
	var parts int64
	for _, p := range []string{"0", "1"} {
		parts += total(t, ms, "messaging.client.consumed.messages", append(base, attribute.String("messaging.destination.partition.id", p),
			attribute.String("messaging.operation.name", "process"))...)
	}
	if parts != st.Delivered {
		t.Errorf("consumed by partition: %d of %d", parts, st.Delivered)
	}
	if got := total(t, ms, "idem.consumer.transactions", append(base, attribute.String("idem.transaction.outcome", "commit"))...); got != st.Commits {
		t.Errorf("committed transactions %d, Stats.Commits %d", got, st.Commits)
	}
	for _, cause := range []string{"permanent", "bad_input"} {
		if got := total(t, ms, "idem.consumer.dead_letters", append(base, attribute.String("idem.dead_letter.cause", cause))...); got < 1 {
			t.Errorf("no dead letter of cause %s", cause)
		}
	}
	for _, name := range []string{"idem.consumer.claim.duration", "idem.consumer.commit.duration", "messaging.process.duration"} {
		if got := total(t, ms, name, base...); got < 1 {
			t.Errorf("%s has no observation", name)
		}
	}

	// The trace.
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range s.spans.Ended() {
		byID[sp.SpanContext().SpanID()] = sp
	}
	linked := map[trace.SpanID]bool{}
	var claims, commits int
	for _, sp := range s.spans.Ended() {
		parent := byID[sp.Parent().SpanID()]
		switch sp.Name() {
		case "process " + topic:
			attrs := attribute.NewSet(sp.Attributes()...)
			if v, _ := attrs.Value("messaging.consumer.group.name"); v.AsString() != group || sp.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("batch span: %v %v", sp.SpanKind(), sp.Attributes())
			}
			for _, l := range sp.Links() {
				linked[l.SpanContext.SpanID()] = true
			}
		case "idem claim":
			claims++
			if parent == nil || parent.Name() != "idem transaction" || byID[parent.Parent().SpanID()].Name() != "process "+topic {
				t.Errorf("claim span's parent %v", parent)
			}
		case "idem commit":
			commits++
		}
	}
	for id := range producers {
		if !linked[id] {
			t.Errorf("producer span %v not linked from a batch span", id)
		}
	}
	if claims == 0 || int64(commits) < st.Commits {
		t.Errorf("%d claim spans, %d commit spans, %d commits", claims, commits, st.Commits)
	}

	// The dead letters carry their dead-letter span's context.
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: brokers, Topic: dlq, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	for i := int64(0); i < st.DeadLettered; i++ {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		m, err := r.ReadMessage(rctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		hs := make([]consumer.Header, len(m.Headers))
		for i, h := range m.Headers {
			hs[i] = consumer.Header{Key: h.Key, Value: h.Value}
		}
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, otelconsumer.HeaderCarrier{Headers: &hs}))
		sp, ok := byID[sc.SpanID()]
		if !ok || sp.Name() != "dead_letter "+topic || byID[sp.Parent().SpanID()].Name() != "process "+topic {
			t.Errorf("dead letter at %d: trace context %v is not a dead-letter span's under a batch", m.Offset, sc)
		}
		var traceparents int
		cause := ""
		for _, h := range hs {
			switch h.Key {
			case "traceparent":
				traceparents++
			case wire.MetaCause:
				cause = string(h.Value)
			}
		}
		if c, ok := wire.ParseCause(cause); traceparents != 1 || !ok || (c != consumer.CausePermanent && c != consumer.CauseBadInput) {
			t.Errorf("dead letter at %d: %d traceparent headers, cause %q", m.Offset, traceparents, cause)
		}
	}
}
