package kafka_test

// Fast tests against kfake, franz-go's in-process Kafka. kfake accepts
// protocol versions a real Kafka 4 rejects; integration_test.go runs the
// same kind of checks against the real broker.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup/memstore"
	"github.com/idemkit/idem/internal/testenv/kafkatest"
)

func fake(t *testing.T, opts ...kfake.Opt) (*kfake.Cluster, []string) {
	t.Helper()
	opts = append([]kfake.Opt{kfake.GroupMinSessionTimeout(time.Second)}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()
}

// memConfig is a consumer on memstore whose handler records one effect per
// committed message, keyed by the record key.
func memConfig(t testing.TB, src source.Source, eff *effects) consumer.Config[*memstore.Tx] {
	return consumer.Config[*memstore.Tx]{
		Name:   "kfake",
		Source: src,
		Store:  memstore.New(memstore.Config{}),
		Handler: consumer.HandlerFunc[*memstore.Tx](func(_ context.Context, tx *memstore.Tx, m *consumer.Message) error {
			k := string(m.Key)
			tx.OnCommit(func() { eff.add(k) })
			return nil
		}),
		Key:        consumer.ByRecordKey(),
		DeadLetter: &consumertest.DeadLetters{},
		BatchSize:  20,
		Clock:      consumertest.NewClock(),
		Logger:     testLogger(t),
	}
}

// keyed builds n messages over partitions, keyed "k<i>", with every fifth
// message repeating an earlier key (same payload). It returns the messages
// and the set of distinct keys.
func keyed(prefix string, n, partitions int) ([]kafkago.Message, map[string]bool) {
	msgs := make([]kafkago.Message, n)
	keys := make(map[string]bool)
	for i := range msgs {
		k := i
		if i%5 == 4 {
			k = i / 2 // a duplicate of an earlier message, most likely on another partition
		}
		key := fmt.Sprintf("%s%d", prefix, k)
		keys[key] = true
		msgs[i] = kafkago.Message{Partition: i % partitions, Key: []byte(key), Value: []byte(`{"n":` + strconv.Itoa(k) + `}`)}
	}
	return msgs, keys
}

func TestFakeConsumesOnceCommitsAndResumes(t *testing.T) {
	_, brokers := fake(t, kfake.SeedTopics(3, "orders"))
	a := newAdmin(t, brokers)
	msgs, keys := keyed("k", 600, 3)
	a.Produce(t, "orders", msgs...)

	eff := newEffects()
	group := name(t, "g")
	r := start(t, memConfig(t, newSource(t, sourceConfig(t, brokers, "orders", group)), eff))
	waitUntil(t, time.Minute, "every key applied", func() bool { n, _ := eff.counts(); return n == len(keys) })
	r.Stop(t)
	eff.requireOnce(t, keys)
	if st := r.Stats(); st.Duplicates != int64(len(msgs)-len(keys)) {
		t.Errorf("stats %+v: want %d duplicates", st, len(msgs)-len(keys))
	}
	a.requireNoLag(t, group, "orders")

	// A restart resumes after the committed offsets: only the new message
	// is delivered.
	eff2 := newEffects()
	r2 := start(t, memConfig(t, newSource(t, sourceConfig(t, brokers, "orders", group)), eff2))
	a.Produce(t, "orders", kafkago.Message{Partition: 1, Key: []byte("late"), Value: []byte(`{}`)})
	waitUntil(t, time.Minute, "the late message applied", func() bool { n, _ := eff2.counts(); return n == 1 })
	r2.Stop(t)
	eff2.requireOnce(t, map[string]bool{"late": true})
	if st := r2.Stats(); st.Delivered != 1 {
		t.Errorf("after restart: %d deliveries, want 1 (the new message)", st.Delivered)
	}
	a.requireNoLag(t, group, "orders")
}

func TestFakeMembersJoinAndLeave(t *testing.T) {
	_, brokers := fake(t, kfake.SeedTopics(4, "orders"))
	a := newAdmin(t, brokers)
	group := name(t, "g")
	samples := sampleOffsets(t, a, group, "orders")
	eff := newEffects()
	store := memstore.New(memstore.Config{})
	member := func() *running {
		cfg := memConfig(t, newSource(t, sourceConfig(t, brokers, "orders", group)), eff)
		cfg.Store = store // one store for the group, as one database would be
		inner := cfg.Handler
		cfg.Handler = consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
			time.Sleep(time.Millisecond) // pace: members change while messages are in flight
			return inner.Handle(ctx, tx, m)
		})
		return start(t, cfg)
	}
	all := make(map[string]bool)
	wave := func(i int) {
		msgs, keys := keyed(fmt.Sprintf("w%d-", i), 400, 4)
		for k := range keys {
			all[k] = true
		}
		a.Produce(t, "orders", msgs...)
	}
	m1, m2 := member(), member()
	waitUntil(t, time.Minute, "two members", func() bool { return a.StableMembers(group) == 2 })
	wave(0)
	waitUntil(t, time.Minute, "wave 0 partly applied", func() bool { n, _ := eff.counts(); return n >= 100 })
	m1.Stop(t) // leaves while the group is busy
	wave(1)
	m3 := member()
	waitUntil(t, time.Minute, "m3 joined", func() bool { return a.StableMembers(group) == 2 })
	if n, _ := eff.counts(); n == len(all) {
		t.Log("everything was applied before m3 joined; the test is too fast to overlap")
	}
	wave(2)
	waitUntil(t, time.Minute, "every key applied", func() bool { n, _ := eff.counts(); return n == len(all) })
	m2.Stop(t)
	m3.Stop(t)
	eff.requireOnce(t, all)
	a.requireNoLag(t, group, "orders")
	samples.RequireMonotonic(t)
	if m3.Stats().Applied == 0 {
		t.Error("m3 applied nothing")
	}
}

func TestFakeDeadLetters(t *testing.T) {
	_, brokers := fake(t, kfake.SeedTopics(2, "payments", "payments.dlq"))
	a := newAdmin(t, brokers)
	eff := newEffects()
	scfg := sourceConfig(t, brokers, "payments", name(t, "g"))
	scfg.DeadLetterMaxBytes = 64
	src := newSource(t, scfg)
	cfg := memConfig(t, src, eff)
	cfg.DeadLetter = src
	cfg.Key = consumer.ByJSONField("txn")
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if v, ok := m.Header("reject"); ok {
			return consumer.Permanent(errors.New(string(v)))
		}
		return inner.Handle(ctx, tx, m)
	})
	big := `{"txn":"big","pad":"` + strings.Repeat("x", 100) + `"}`
	a.Produce(t, "payments",
		kafkago.Message{Partition: 0, Key: []byte("a"), Value: []byte(`{"txn":"a"}`)},
		kafkago.Message{Partition: 0, Key: []byte("bad"), Value: []byte(`not json`), Headers: []kafkago.Header{{Key: "trace", Value: []byte("t1")}}},
		kafkago.Message{Partition: 0, Key: []byte("b"), Value: []byte(`{"txn":"b"}`)},
		kafkago.Message{Partition: 1, Key: []byte("rej"), Value: []byte(`{"txn":"rej"}`), Headers: []kafkago.Header{{Key: "reject", Value: []byte("amount is negative")}}},
		kafkago.Message{Partition: 1, Key: []byte("big"), Value: []byte(big), Headers: []kafkago.Header{{Key: "reject", Value: []byte("too big")}}},
		kafkago.Message{Partition: 1, Key: []byte("c"), Value: []byte(`{"txn":"c"}`)},
	)
	r := start(t, cfg)
	waitUntil(t, time.Minute, "good messages applied", func() bool { n, _ := eff.counts(); return n == 3 })
	waitUntil(t, time.Minute, "three dead letters", func() bool { return r.Stats().DeadLettered == 3 })
	r.Stop(t)
	eff.requireOnce(t, map[string]bool{"a": true, "b": true, "c": true})

	letters := a.readAll(t, "payments.dlq", 3)
	byKey := map[string]kafkago.Message{}
	for _, m := range letters {
		byKey[string(m.Key)] = m
	}
	bad := byKey["bad"]
	wantHeaders(t, bad, map[string]string{
		"trace": "t1", wire.MetaTopic: "payments", wire.MetaPartition: "0", wire.MetaOffset: "1",
		wire.MetaAttempts: "0",
	})
	if string(bad.Value) != "not json" || bad.Partition != 0 {
		t.Errorf("bad letter: value %q partition %d", bad.Value, bad.Partition)
	}
	if reason := kafkatest.Header(bad, wire.MetaReason); !containsAll(reason, "malformed payload") {
		t.Errorf("bad letter reason %q", reason)
	}
	if _, ok := kafkatest.HeaderOK(bad, wire.MetaKey); ok {
		t.Error("a letter without a key has a key header")
	}
	rej := byKey["rej"]
	wantHeaders(t, rej, map[string]string{wire.MetaKey: "rej", wire.MetaKeyScope: "kfake", wire.MetaOffset: "0",
		wire.MetaPartition: "1", wire.MetaAttempts: "1"})
	if reason := kafkatest.Header(rej, wire.MetaReason); !containsAll(reason, "amount is negative") {
		t.Errorf("rejected letter reason %q", reason)
	}
	bigL := byKey["big"]
	wantHeaders(t, bigL, map[string]string{wire.MetaAttempts: "1", wire.MetaReason: "permanent: too big"})
	if len(bigL.Value) != 0 || kafkatest.Header(bigL, wire.MetaValueSize) != strconv.Itoa(len(big)) || len(kafkatest.Header(bigL, wire.MetaValueSHA256)) != 64 {
		t.Errorf("oversized letter: value %d bytes, headers %v", len(bigL.Value), bigL.Headers)
	}
}

func TestFakeLeaderMoves(t *testing.T) {
	c, brokers := fake(t, kfake.NumBrokers(2), kfake.SeedTopics(2, "orders"))
	a := newAdmin(t, brokers)
	first, keys := keyed("a", 200, 2)
	a.Produce(t, "orders", first...)
	eff := newEffects()
	group := name(t, "g")
	r := start(t, memConfig(t, newSource(t, sourceConfig(t, brokers, "orders", group)), eff))
	waitUntil(t, time.Minute, "first half applied", func() bool { n, _ := eff.counts(); return n == len(keys) })
	for p := int32(0); p < 2; p++ {
		other := 1 - c.LeaderFor("orders", p)
		if err := c.MoveTopicPartition("orders", p, other); err != nil {
			t.Fatal(err)
		}
	}
	second, keys2 := keyed("b", 200, 2)
	a.Produce(t, "orders", second...)
	for k := range keys2 {
		keys[k] = true
	}
	waitUntil(t, time.Minute, "second half applied", func() bool { n, _ := eff.counts(); return n == len(keys) })
	r.Stop(t)
	eff.requireOnce(t, keys)
	a.requireNoLag(t, group, "orders")
}

func TestFakeStalledFetchIsRecreated(t *testing.T) {
	c, brokers := fake(t, kfake.SeedTopics(1, "orders"))
	a := newAdmin(t, brokers)
	var swallowed atomic.Int32
	c.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		swallowed.Add(1)
		return nil, nil, true // never answered: the client must time out
	})
	msgs, keys := keyed("k", 50, 1)
	a.Produce(t, "orders", msgs...)
	eff := newEffects()
	cfg := sourceConfig(t, brokers, "orders", name(t, "g"))
	cfg.RequestTimeout = 500 * time.Millisecond
	r := start(t, memConfig(t, newSource(t, cfg), eff))
	waitUntil(t, time.Minute, "every key applied", func() bool { n, _ := eff.counts(); return n == len(keys) })
	r.Stop(t)
	eff.requireOnce(t, keys)
	if swallowed.Load() != 1 {
		t.Fatalf("%d fetches swallowed, want 1", swallowed.Load())
	}
}

// A broker that answers fetches with nothing although its high watermark
// says there is more (kafka-go #1308 ends in that state) must not wedge the
// partition: the fetcher reconnects.
func TestFakeEmptyFetchesBelowWatermark(t *testing.T) {
	c, brokers := fake(t, kfake.SeedTopics(1, "orders"))
	a := newAdmin(t, brokers)
	msgs, keys := keyed("k", 30, 1)
	a.Produce(t, "orders", msgs...)
	var empties atomic.Int32
	var redialled atomic.Bool
	c.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if empties.Load() > 0 {
			redialled.Store(true) // a fetcher looks its leader up again
		}
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if redialled.Load() {
			c.DropControl()
			return nil, nil, false
		}
		c.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition, sp.HighWatermark, sp.LastStableOffset = rp.Partition, 1000, 1000
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		empties.Add(1)
		return resp, nil, true
	})
	eff := newEffects()
	cfg := sourceConfig(t, brokers, "orders", name(t, "g"))
	cfg.PartitionWatchInterval = -1 // its metadata requests would look like a redial
	r := start(t, memConfig(t, newSource(t, cfg), eff))
	waitUntil(t, time.Minute, "every key applied", func() bool { n, _ := eff.counts(); return n == len(keys) })
	r.Stop(t)
	eff.requireOnce(t, keys)
	if empties.Load() == 0 {
		t.Fatal("no empty fetch was served")
	}
}

// A group started before its topic exists picks the topic's partitions up
// once it is created (kafka-go #585: a reader with an empty assignment never
// recovers).
func TestFakeTopicCreatedLater(t *testing.T) {
	_, brokers := fake(t)
	a := newAdmin(t, brokers)
	eff := newEffects()
	cfg := sourceConfig(t, brokers, "late-topic", name(t, "g"))
	cfg.PartitionWatchInterval = 100 * time.Millisecond
	r := start(t, memConfig(t, newSource(t, cfg), eff))
	waitUntil(t, time.Minute, "the group is up", func() bool { return a.StableMembers(cfg.Group) == 1 })
	a.CreateTopic(t, "late-topic", 2)
	msgs, keys := keyed("k", 40, 2)
	a.Produce(t, "late-topic", msgs...)
	waitUntil(t, time.Minute, "every key applied", func() bool { n, _ := eff.counts(); return n == len(keys) })
	r.Stop(t)
	eff.requireOnce(t, keys)
}

func TestFakeStoppedLaneHoldsItsPartition(t *testing.T) {
	_, brokers := fake(t, kfake.SeedTopics(2, "orders"))
	a := newAdmin(t, brokers)
	var msgs []kafkago.Message
	for i := range 10 {
		msgs = append(msgs,
			kafkago.Message{Partition: 0, Key: []byte("p0-" + strconv.Itoa(i)), Value: []byte("x")},
			kafkago.Message{Partition: 1, Key: []byte("p1-" + strconv.Itoa(i)), Value: []byte("x")})
	}
	a.Produce(t, "orders", msgs...) // p0-4 sits at offset 4 of partition 0
	eff := newEffects()
	group := name(t, "g")
	cfg := memConfig(t, newSource(t, sourceConfig(t, brokers, "orders", group)), eff)
	cfg.OnExhausted = consumer.StopLaneOnExhausted
	cfg.Retry.MaxAttempts = 2
	var poisoned atomic.Int32
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		if string(m.Key) == "p0-4" {
			poisoned.Add(1)
			return errors.New("downstream unavailable")
		}
		return inner.Handle(ctx, tx, m)
	})
	r := start(t, cfg)
	waitUntil(t, time.Minute, "partition 1 and p0-0..3 applied, p0-4 tried twice", func() bool {
		n, _ := eff.counts()
		return n == 14 && poisoned.Load() == 2
	})
	r.Stop(t)
	if got := a.committed(t, group, "orders"); got[0] != 4 || got[1] != 10 {
		t.Fatalf("committed %v, want [4 10]: partition 0 must resume at the poisoned message", got)
	}
}

func TestFakeStopWithBrokerGone(t *testing.T) {
	c, brokers := fake(t, kfake.SeedTopics(2, "orders"))
	a := newAdmin(t, brokers)
	msgs, keys := keyed("k", 100, 2)
	a.Produce(t, "orders", msgs...)
	eff := newEffects()
	r := start(t, memConfig(t, newSource(t, sourceConfig(t, brokers, "orders", name(t, "g"))), eff))
	waitUntil(t, time.Minute, "every key applied", func() bool { n, _ := eff.counts(); return n == len(keys) })
	a.Transport.CloseIdleConnections()
	c.Close()
	r.StopWithin(t, 5*time.Second)
}

// A broker that accepts requests and never answers them: Stop still returns
// within its deadline, leaving the group in the background (CloseTimeout).
func TestFakeStopWithBrokerHung(t *testing.T) {
	c, brokers := fake(t, kfake.SeedTopics(2, "orders"))
	a := newAdmin(t, brokers)
	msgs, keys := keyed("k", 100, 2)
	a.Produce(t, "orders", msgs...)
	eff := newEffects()
	cfg := sourceConfig(t, brokers, "orders", name(t, "g"))
	cfg.CloseTimeout = time.Second
	r := start(t, memConfig(t, newSource(t, cfg), eff))
	waitUntil(t, time.Minute, "every key applied", func() bool { n, _ := eff.counts(); return n == len(keys) })
	c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, nil, true // swallowed
	})
	r.StopWithin(t, 10*time.Second)
}

func TestFakeSASL(t *testing.T) {
	scram512, err := scram.Mechanism(scram.SHA512, "carol", "c-secret")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mech sasl.Mechanism
	}{
		{"PLAIN", plain.Mechanism{Username: "alice", Password: "a-secret"}},
		{"SCRAM-SHA-512", scram512},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, brokers := fake(t, kfake.EnableSASL(), kfake.Superuser("PLAIN", "alice", "a-secret"),
				kfake.Superuser("SCRAM-SHA-512", "carol", "c-secret"), kfake.SeedTopics(1, "orders", "orders.dlq"))
			tr := &kafkago.Transport{SASL: tc.mech}
			defer tr.CloseIdleConnections()
			w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: "orders", Transport: tr, BatchTimeout: time.Millisecond}
			if err := w.WriteMessages(ctxTimeout(t, 30*time.Second),
				kafkago.Message{Key: []byte("ok"), Value: []byte(`{}`)},
				kafkago.Message{Key: []byte("rej"), Value: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
			w.Close()

			eff := newEffects()
			scfg := sourceConfig(t, brokers, "orders", name(t, "g"))
			scfg.SASL = tc.mech // the dead-letter writer's too
			src := newSource(t, scfg)
			cfg := memConfig(t, src, eff)
			cfg.DeadLetter = src
			inner := cfg.Handler
			cfg.Handler = consumer.HandlerFunc[*memstore.Tx](func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
				if string(m.Key) == "rej" {
					return consumer.Permanent(errors.New("rejected"))
				}
				return inner.Handle(ctx, tx, m)
			})
			r := start(t, cfg)
			waitUntil(t, time.Minute, "one applied, one dead-lettered", func() bool {
				n, _ := eff.counts()
				return n == 1 && r.Stats().DeadLettered == 1
			})
			r.Stop(t)
		})
	}
}

func wantHeaders(t *testing.T, m kafkago.Message, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, ok := kafkatest.HeaderOK(m, k); !ok || got != v {
			t.Errorf("letter %s: header %s = %q (present %v), want %q", m.Key, k, got, ok, v)
		}
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// txnMsg is a message keyed key whose value is a small JSON document.
func txnMsg(partition int, key string) kafkago.Message {
	return kafkago.Message{Partition: partition, Key: []byte(key), Value: []byte(`{"id":"` + key + `"}`)}
}

func keySet(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// requireNoLetters fails if the consumer dead-lettered anything: a
// transaction marker that reached the consumer would be a message without a
// usable key or payload.
func requireNoLetters(t testing.TB, cfg consumer.Config[*memstore.Tx]) {
	t.Helper()
	if l := cfg.DeadLetter.(*consumertest.DeadLetters).Letters(); len(l) > 0 {
		t.Fatalf("%d dead letters, the first %s (key %q, value %q): %v", len(l), l[0].Message.Coordinates(),
			l[0].Message.Key, l[0].Message.Value, l[0].Reason)
	}
}

// A topic written by a transactional producer is read committed: the handler
// gets the records of committed transactions and those written outside any
// transaction, never a transaction marker nor a record of an aborted
// transaction, and nothing past the last stable offset while a transaction
// is open. The markers take offsets all the same: the group ends without
// lag, also on a partition whose last record is a marker.
func TestFakeTransactionalTopic(t *testing.T) {
	c, brokers := fake(t, kfake.SeedTopics(2, "orders"))
	a := newAdmin(t, brokers)
	tp := newTxnProducer(t, brokers, "orders")
	tp.tx(t, true, txnMsg(0, "c1"), txnMsg(0, "c2"), txnMsg(1, "c1b"))
	a.Produce(t, "orders", txnMsg(0, "n1"))
	tp.begin(t)
	tp.write(t, txnMsg(0, "a1"), txnMsg(1, "a3"))
	a.Produce(t, "orders", txnMsg(0, "n2")) // inside the aborted transaction's offsets, not part of it
	tp.write(t, txnMsg(0, "a2"))
	tp.end(t, false)
	tp.tx(t, true, txnMsg(0, "c3"))
	// Partition 0: c1 c2 COMMIT n1 a1 n2 a2 ABORT c3 COMMIT;
	// partition 1: c1b COMMIT a3 ABORT.
	want := keySet("c1", "c2", "c1b", "n1", "n2", "c3")

	eff := newEffects()
	group := name(t, "g")
	cfg := memConfig(t, newSource(t, sourceConfig(t, brokers, "orders", group)), eff)
	r := start(t, cfg)
	waitUntil(t, time.Minute, "the committed records applied", func() bool { n, _ := eff.counts(); return n >= len(want) })
	waitUntil(t, time.Minute, "no lag", func() bool {
		return fmt.Sprint(a.committed(t, group, "orders")) == fmt.Sprint(a.highWatermarks(t, "orders"))
	})

	// An open transaction holds back everything after its first record,
	// the record written outside it too, until it ends.
	var atOpen atomic.Int32
	var openAt atomic.Int64
	openAt.Store(-1)
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, rt := range kreq.(*kmsg.FetchRequest).Topics {
			for _, rp := range rt.Partitions {
				if rp.Partition == 0 && rp.FetchOffset == openAt.Load() {
					atOpen.Add(1)
				}
			}
		}
		return nil, nil, false
	})
	tp.begin(t)
	openAt.Store(tp.write(t, txnMsg(0, "o1"))[0])
	a.Produce(t, "orders", txnMsg(0, "n3"))
	waitUntil(t, time.Minute, "three fetches at the open transaction's first offset", func() bool { return atOpen.Load() >= 3 })
	if _, total := eff.counts(); total != len(want) {
		t.Fatalf("%d effects while a transaction is open, want %d: nothing past the last stable offset", total, len(want))
	}
	tp.end(t, true)
	want["o1"], want["n3"] = true, true
	waitUntil(t, time.Minute, "the transaction's records applied", func() bool { n, _ := eff.counts(); return n >= len(want) })
	r.Stop(t)
	eff.requireOnce(t, want)
	requireNoLetters(t, cfg)
	a.requireNoLag(t, group, "orders")

	// A restart resumes after the markers: it gets the new transactions'
	// committed records and nothing else.
	tp.tx(t, false, txnMsg(0, "a4"), txnMsg(1, "a5"))
	tp.tx(t, true, txnMsg(1, "c6"))
	eff2 := newEffects()
	cfg2 := memConfig(t, newSource(t, sourceConfig(t, brokers, "orders", group)), eff2)
	r2 := start(t, cfg2)
	waitUntil(t, time.Minute, "c6 applied", func() bool { n, _ := eff2.counts(); return n >= 1 })
	waitUntil(t, time.Minute, "no lag", func() bool {
		return fmt.Sprint(a.committed(t, group, "orders")) == fmt.Sprint(a.highWatermarks(t, "orders"))
	})
	r2.Stop(t)
	eff2.requireOnce(t, keySet("c6"))
	requireNoLetters(t, cfg2)
	if st := r2.Stats(); st.Delivered != 1 {
		t.Errorf("after the restart: %d deliveries, want 1 (c6)", st.Delivered)
	}
}

// The topic is deleted and created again while the group owns its
// partition: the fetcher finds its offset past the new log's end and starts
// over at the log start, below offsets it delivered before (kafka-go #1332
// aside, this is Kafka's auto.offset.reset). The messages of the old topic
// still in the lane are settled without committing anything of the new one,
// the new messages are acked and committed, and Stop returns.
func TestFakeTopicRecreatedUnderAssignment(t *testing.T) {
	_, brokers := fake(t, kfake.SeedTopics(1, "orders"))
	a := newAdmin(t, brokers)
	var old []kafkago.Message
	want := map[string]bool{}
	for i := range 10 {
		old = append(old, txnMsg(0, fmt.Sprintf("old-%d", i)))
		want[fmt.Sprintf("old-%d", i)] = true
	}
	a.Produce(t, "orders", old...)

	eff := newEffects()
	group := name(t, "g")
	scfg := sourceConfig(t, brokers, "orders", group)
	scfg.PartitionWatchInterval = -1 // the assignment outlives the topic
	cfg := memConfig(t, newSource(t, scfg), eff)
	release := make(chan struct{})
	cfg.Handler = holdKey(cfg.Handler, "old-9", release) // in flight while the topic is recreated
	r := start(t, cfg)
	waitUntil(t, time.Minute, "the old messages delivered", func() bool { return r.Stats().Delivered == 10 })

	a.recreate(t, "orders", 1)
	var fresh []kafkago.Message
	for i := range 3 {
		fresh = append(fresh, txnMsg(0, fmt.Sprintf("new-%d", i)))
		want[fmt.Sprintf("new-%d", i)] = true
	}
	a.Produce(t, "orders", fresh...)
	waitUntil(t, time.Minute, "the new topic's messages delivered behind old-9", func() bool { return r.Stats().Delivered == 13 })
	close(release)
	waitUntil(t, time.Minute, "every message applied", func() bool { n, _ := eff.counts(); return n == len(want) })
	waitUntil(t, time.Minute, "the new log committed to its end", func() bool {
		return a.committed(t, group, "orders")[0] == a.highWatermarks(t, "orders")[0]
	})
	r.StopWithin(t, 30*time.Second)
	eff.requireOnce(t, want)
	a.requireNoLag(t, group, "orders")
}

// With ReadUncommitted the records of aborted and of open transactions are
// delivered too; transaction markers still are not, and still do not hold
// the watermark back.
func TestFakeReadUncommitted(t *testing.T) {
	_, brokers := fake(t, kfake.SeedTopics(1, "orders"))
	a := newAdmin(t, brokers)
	tp := newTxnProducer(t, brokers, "orders")
	tp.tx(t, true, txnMsg(0, "c1"))
	tp.tx(t, false, txnMsg(0, "a1"))
	open := newTxnProducer(t, brokers, "orders")
	open.begin(t)
	open.write(t, txnMsg(0, "o1"))
	a.Produce(t, "orders", txnMsg(0, "n1"))
	want := keySet("c1", "a1", "o1", "n1")

	eff := newEffects()
	group := name(t, "g")
	scfg := sourceConfig(t, brokers, "orders", group)
	scfg.ReadUncommitted = true
	cfg := memConfig(t, newSource(t, scfg), eff)
	r := start(t, cfg)
	waitUntil(t, time.Minute, "every record applied", func() bool { n, _ := eff.counts(); return n >= len(want) })
	waitUntil(t, time.Minute, "no lag", func() bool {
		return a.committed(t, group, "orders")[0] == a.highWatermarks(t, "orders")[0]
	})
	r.Stop(t)
	eff.requireOnce(t, want)
	requireNoLetters(t, cfg)
}

// fakeBatch is a record batch of a compacted log: it spans base..last, and
// compaction kept the records at offsets (maybe none).
type fakeBatch struct {
	base, last int64
	offsets    []int64
}

// encode returns b as a v2 record batch, its records keyed "r<offset>".
func (b fakeBatch) encode() []byte {
	var recs []byte
	for _, off := range b.offsets {
		r := kmsg.Record{OffsetDelta: int32(off - b.base), Key: []byte(fmt.Sprintf("r%d", off)), Value: []byte(`{}`)}
		r.Length = int32(len(r.AppendTo(nil)) - 1) // everything after the (one-byte) length
		recs = r.AppendTo(recs)
	}
	rb := kmsg.RecordBatch{
		FirstOffset: b.base, Magic: 2, LastOffsetDelta: int32(b.last - b.base),
		ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1,
		NumRecords: int32(len(b.offsets)), Records: recs,
		Length: int32(49 + len(recs)),
	}
	raw := rb.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[17:21], crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli)))
	return raw
}

// A compacted log: batches whose tail was compacted away, or all of whose
// records were (Kafka keeps such a batch, empty, for its producer's
// sequence), each answered alone as at the end of a log segment. kafka-go's
// protocol package does not decode a batch's last offset; the fetcher finds
// it and moves on, and the watermark reaches the high watermark.
func TestFakeCompactedBatchEnds(t *testing.T) {
	c, brokers := fake(t, kfake.SeedTopics(1, "orders"))
	a := newAdmin(t, brokers)
	log := []fakeBatch{
		{base: 0, last: 4, offsets: []int64{0, 1, 2}},
		{base: 5, last: 7},
		{base: 8, last: 9, offsets: []int64{8, 9}},
		{base: 12, last: 150, offsets: []int64{12}}, // 10 and 11 compacted with their batch
	}
	const hwm = 151
	var fetches atomic.Int32
	c.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		fetches.Add(1)
		req := kreq.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition, sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = rp.Partition, hwm, hwm, 0
				for _, b := range log {
					if b.last >= rp.FetchOffset {
						sp.RecordBatches = b.encode()
						break
					}
				}
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	eff := newEffects()
	group := name(t, "g")
	r := start(t, memConfig(t, newSource(t, sourceConfig(t, brokers, "orders", group)), eff))
	want := keySet("r0", "r1", "r2", "r8", "r9", "r12")
	waitUntil(t, time.Minute, "the kept records applied", func() bool { n, _ := eff.counts(); return n >= len(want) })
	waitUntil(t, time.Minute, "committed to the high watermark", func() bool { return a.committed(t, group, "orders")[0] == hwm })
	r.Stop(t)
	eff.requireOnce(t, want)
	t.Logf("%d fetches", fetches.Load())
}
