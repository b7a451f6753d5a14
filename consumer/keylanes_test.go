package consumer_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup/memstore"
)

// TestKeyLanesKeepPerKeyOrder: one partition, 600 messages of 12 record
// keys, spread over 4 key lanes, delivered up to twice with lost acks:
// every message applied once, and each key's messages applied in offset
// order.
func TestKeyLanesKeepPerKeyOrder(t *testing.T) {
	var mu sync.Mutex
	applied := map[string][]int64{} // record key -> offsets, in commit order
	eff := newEffects()
	cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
		id, _ := consumer.ByJSONField("txn_id")(m)
		eff.add(tx, id)
		k, off := string(m.Key), m.Offset
		if off%5 == 0 {
			time.Sleep(2 * time.Millisecond) // uneven lanes: order is not kept by accident
		}
		tx.OnCommit(func() {
			mu.Lock()
			applied[k] = append(applied[k], off)
			mu.Unlock()
		})
		return nil
	})
	cfg.KeyLanes = 4
	cfg.BatchSize = 10
	var msgs []*consumer.Message
	var keys []string
	rng := rand.New(rand.NewPCG(19, 19))
	for i := range 600 {
		msgs = append(msgs, consumertest.Message("pay", 0, int64(i), fmt.Sprintf("acct-%02d", rng.IntN(12)), payment(i)))
		keys = append(keys, fmt.Sprintf("T%05d", i))
	}
	consumertest.Run(t, cfg, consumertest.Script{MinDeliveries: 1, MaxDeliveries: 2, CrashAfterCommitEvery: 4}, msgs...)
	eff.check(t, keys)
	if len(applied) != 12 {
		t.Fatalf("%d keys applied, want 12", len(applied))
	}
	for k, offs := range applied {
		for i := 1; i < len(offs); i++ {
			if offs[i] <= offs[i-1] {
				t.Fatalf("key %s: offset %d applied after %d: %v", k, offs[i], offs[i-1], offs)
			}
		}
	}
}

// TestKeyLanesRunInParallel: the messages of one partition, of 16 record
// keys, are handled in more than one transaction at a time with KeyLanes,
// and never without.
func TestKeyLanesRunInParallel(t *testing.T) {
	for _, lanes := range []int{0, 4} {
		t.Run(fmt.Sprintf("KeyLanes=%d", lanes), func(t *testing.T) {
			var inside, most, calls atomic.Int64
			var names sync.Map
			cfg := baseConfig(func(ctx context.Context, tx *memstore.Tx, m *consumer.Message) error {
				n := inside.Add(1)
				defer inside.Add(-1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				if calls.Add(1) > 4 {
					return nil
				}
				// The first four transactions wait until another one is seen
				// beside them, for at most 500 ms: long enough for a second
				// lane to start on a loaded machine.
				deadline := time.Now().Add(500 * time.Millisecond)
				for most.Load() < 2 && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				return nil
			})
			cfg.KeyLanes = lanes
			cfg.BatchSize = 1
			cfg.Observer = laneNames{m: &names}
			var msgs []*consumer.Message
			for i := range 64 {
				msgs = append(msgs, consumertest.Message("pay", 0, int64(i), fmt.Sprintf("k%d", i%16), payment(i)))
			}
			consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
			var got []string
			names.Range(func(k, _ any) bool { got = append(got, k.(string)); return true })
			switch {
			case lanes == 0 && (most.Load() != 1 || len(got) != 1 || got[0] != "pay/0"):
				t.Fatalf("without key lanes: %d transactions at once, lanes %v; want 1 and [pay/0]", most.Load(), got)
			case lanes == 4 && most.Load() < 2:
				t.Fatalf("with 4 key lanes: at most %d transaction at a time", most.Load())
			case lanes == 4 && len(got) != 4:
				t.Fatalf("with 4 key lanes: lanes %v", got)
			}
			for _, n := range got {
				if lanes == 4 && !strings.HasPrefix(n, "pay/0#") {
					t.Fatalf("key lane named %q, want pay/0#k", n)
				}
			}
		})
	}
}

// laneNames records the lanes that ran batches.
type laneNames struct {
	consumer.NopObserver
	m *sync.Map
}

func (o laneNames) BatchStart(ctx context.Context, b consumer.Batch) context.Context {
	o.m.Store(b.Lane, true)
	return ctx
}

func TestKeyLanesValidated(t *testing.T) {
	for _, n := range []int{-1, 257} {
		cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
		cfg.Source = consumertest.NewSource(consumertest.Script{})
		cfg.DeadLetter = &consumertest.DeadLetters{}
		cfg.KeyLanes = n
		if _, err := consumer.New(cfg); err == nil || !strings.Contains(err.Error(), "KeyLanes") {
			t.Errorf("KeyLanes %d: error %v, want one naming KeyLanes", n, err)
		}
	}
}

// TestKeyLanesSpreadHashPartitionedKeys: a topic whose producer picked
// each record's partition by FNV-1a of its key — Sarama's default
// partitioner, kafka-go's Hash balancer — has on each partition only keys
// of a few FNV-1a residues. Key lanes must still spread each partition's
// keys over all of them, not over the few that FNV-1a modulo KeyLanes
// leaves (2 or 4 of 8 on a topic of 4 partitions).
func TestKeyLanesSpreadHashPartitionedKeys(t *testing.T) {
	const partitions, lanes = 4, 8
	var names sync.Map
	cfg := baseConfig(func(context.Context, *memstore.Tx, *consumer.Message) error { return nil })
	cfg.KeyLanes = lanes
	cfg.Observer = laneNames{m: &names}
	var msgs []*consumer.Message
	offsets := make([]int64, partitions)
	for i := range 512 {
		key := fmt.Sprintf("rf-%04d", i)
		p := saramaPartition(key, partitions)
		msgs = append(msgs, consumertest.Message("pay", p, offsets[p], key, payment(i)))
		offsets[p]++
	}
	consumertest.Run(t, cfg, consumertest.Script{}, msgs...)
	used := map[string]int{}
	names.Range(func(k, _ any) bool {
		source, _, _ := strings.Cut(k.(string), "#")
		used[source]++
		return true
	})
	for p := range partitions {
		if n := used[fmt.Sprintf("pay/%d", p)]; n != lanes {
			t.Errorf("partition %d: its keys ran in %d of %d key lanes (%v)", p, n, lanes, used)
		}
	}
}

// saramaPartition is the partition Sarama's default partitioner and
// kafka-go's Hash balancer give key: FNV-1a, as an int32, modulo n, its
// absolute value.
func saramaPartition(key string, n int) int32 {
	h := fnv.New32a()
	h.Write([]byte(key))
	p := int32(h.Sum32()) % int32(n)
	if p < 0 {
		p = -p
	}
	return p
}
