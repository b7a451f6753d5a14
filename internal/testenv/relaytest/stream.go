package relaytest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/outbox"
)

// Enqueue enqueues perKey messages for each of keys keys ("k000", ...), key
// k to topics[k%len(topics)], from keys/3 goroutines (a key is always written by the same one,
// in order), in transactions of 1 to 4 messages per key. Values are
// "<key> <n>". It returns how many messages it enqueued.
func Enqueue(t testing.TB, pool *pgxpool.Pool, ob *outbox.Outbox, keys, perKey int, topics ...string) int {
	t.Helper()
	writers := max(1, keys/3)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < perKey; {
				size := 1 + (n+w)%4
				err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
					var msgs []outbox.Message
					for i := 0; i < size && n+i < perKey; i++ {
						for k := w; k < keys; k += writers {
							key := fmt.Sprintf("k%03d", k)
							msgs = append(msgs, outbox.Message{Topic: topics[k%len(topics)], Key: []byte(key), Value: []byte(key + " " + strconv.Itoa(n+i))})
						}
					}
					return ob.EnqueueFor(context.Background(), tx, dedup.Key{Scope: "producer", ID: fmt.Sprintf("w%d-%d", w, n)}, msgs...)
				})
				if err != nil {
					errs <- err
					return
				}
				n += size
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return keys * perKey
}

// Delivered is a message as a broker gave it back: its outbox.HeaderID,
// record key and value, and, for CheckPublishedOnce, the partition (or
// queue) it lies in and its headers (or user properties).
type Delivered struct {
	ID, Key, Value string
	Partition      int32
	Header         func(name string) string
}

// CheckKeyOrder checks messages from Enqueue, read back per partition or
// queue in order: the first copy of each (by ID) comes in its key's order,
// all want of them are there. It returns how many copies were duplicates.
func CheckKeyOrder(t testing.TB, got []Delivered, want int) int {
	t.Helper()
	seen := map[string]bool{}
	next := map[string]int{}
	dups := 0
	for _, d := range got {
		if d.ID == "" {
			t.Fatalf("message %q without %s", d.Value, outbox.HeaderID)
		}
		if seen[d.ID] {
			dups++
			continue
		}
		seen[d.ID] = true
		key, nstr, _ := strings.Cut(d.Value, " ")
		n, _ := strconv.Atoi(nstr)
		if key != d.Key {
			t.Fatalf("message %s: value %q under key %q", d.ID, d.Value, d.Key)
		}
		if n != next[key] {
			t.Fatalf("key %s: message %d arrived (first copy) when %d was due", key, n, next[key])
		}
		next[key]++
	}
	if len(seen) != want {
		t.Fatalf("%d distinct messages arrived, want %d", len(seen), want)
	}
	return dups
}

// checkLineage checks messages from Enqueue as a broker gave them back:
// each key lies in one partition (or queue), and each message's ID is the
// outbox.MessageID of the parent its lineage headers name, one of
// Enqueue's.
func checkLineage(t testing.TB, got []Delivered) {
	t.Helper()
	parts := map[string]int32{}
	for _, d := range got {
		if p, ok := parts[d.Key]; ok && p != d.Partition {
			t.Fatalf("key %s in partitions (queues) %d and %d", d.Key, p, d.Partition)
		}
		parts[d.Key] = d.Partition
		parent := dedup.Key{Scope: d.Header(outbox.HeaderScope), ID: d.Header(outbox.HeaderKey)}
		pos, err := strconv.Atoi(d.Header(outbox.HeaderPosition))
		if err != nil || d.ID != outbox.MessageID(parent, pos) || parent.Scope != "producer" {
			t.Fatalf("message %s: its headers (parent %v, position %q) do not name its lineage", d.ID, parent, d.Header(outbox.HeaderPosition))
		}
	}
}

// CheckPublishedOnce checks what a relay published without a fault from
// Enqueue's want messages, as a broker gave them back: each one once, in
// its key's order (CheckKeyOrder), with its lineage (checkLineage), and
// the relay's stats count them published and nothing dead-lettered.
// Failed rounds are allowed: the relay retries them.
func CheckPublishedOnce(t testing.TB, relay *outbox.Relay, got []Delivered, want int) {
	t.Helper()
	if dups := CheckKeyOrder(t, got, want); dups != 0 {
		t.Fatalf("%d copies without a fault", dups)
	}
	checkLineage(t, got)
	if st := relay.Stats(); st.Published != int64(want) || st.DeadLettered != 0 {
		t.Fatalf("stats %+v", st)
	}
}
