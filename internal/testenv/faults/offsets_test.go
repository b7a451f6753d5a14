package faults_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
)

// TestUnackedBelow: a committed offset at or below the acked messages is
// fine however far it went down; one past a message no consumer acked names
// that message.
func TestUnackedBelow(t *testing.T) {
	positions := map[string]pos{}
	acked := map[pos]bool{}
	for q := range 2 {
		for off := range int64(6) {
			p := pos{Part: q, Off: off}
			positions[fmt.Sprintf("q%d-%d", q, off)] = p
			acked[p] = off < 4 || q == 1
		}
	}
	for _, tc := range []struct {
		committed map[int]int64
		want      []string
	}{
		{map[int]int64{0: 4, 1: 6}, nil},
		{map[int]int64{0: 0, 1: 2}, nil}, // went down: redelivery
		{map[int]int64{0: 5, 1: 6}, []string{"q0-4"}},
		{map[int]int64{0: 6}, []string{"q0-4", "q0-5"}},
	} {
		got := unackedBelow(tc.committed, positions, acked)
		ids := slices.Sorted(maps.Keys(got))
		if !slices.Equal(ids, tc.want) {
			t.Errorf("committed %v: unacked below %v, want %v", tc.committed, got, tc.want)
		}
	}
}

// TestOffsetCheckFindsCommitAheadOfAcks shows that the RocketMQ offset check
// can fail, on the real broker. Queue 0 of a topic holds 6 messages of which
// the ack log shows offsets 0 to 3 acked, queue 1 holds 6, all acked; a copy
// of the message at queue 0 offset 4 is in the group's retry topic. With the
// group's offsets committed to 6 and 6, the check reports the message at
// queue 0 offset 5, and only it.
func TestOffsetCheckFindsCommitAheadOfAcks(t *testing.T) {
	t.Parallel()
	b := newRocket(t)
	topic, group := b.newTopic(t, 2)
	var msgs []outMsg
	for i := range 12 {
		msgs = append(msgs, outMsg{ID: fmt.Sprintf("ahead-%d-%d", pid(), i), Value: []byte(`{"n":` + strconv.Itoa(i) + `}`), Part: i % 2})
	}
	b.produce(t, topic, msgs)
	at := map[pos]string{}
	for id, p := range b.positions(t, topic) {
		at[p] = id
	}
	if len(at) != 12 {
		t.Fatalf("positions %v", at)
	}
	var log []byte
	lane := func(q int) string { return topic + "/" + b.Name + "/" + strconv.Itoa(q) }
	for off := range int64(6) {
		if off < 4 {
			log = appendAck(log, lane(0), 0, off)
		}
		log = appendAck(log, lane(1), 1, off)
	}
	log = appendAck(log, "%RETRY%"+group+"/"+b.Name+"/0", 0, 5) // another topic's queue 0
	log = append(log, lane(0)+" 0 5"...)                        // no newline: not passed on yet
	ackFile := filepath.Join(t.TempDir(), "acked")
	if err := os.WriteFile(ackFile, log, 0o644); err != nil {
		t.Fatal(err)
	}
	b.produce(t, "%RETRY%"+group, []outMsg{{ID: at[pos{0, 4}], Value: []byte(`{"n":4}`)}})

	for q := range 2 {
		if err := b.CommitOffset(group, topic, q, 6); err != nil {
			t.Fatalf("commit offset of queue %d: %v", q, err)
		}
	}
	s := newOffsetSampler(t, b, topic, group, func() []string { return []string{ackFile, ackFile + ".none"} })
	testenv.WaitUntilProgress(t, time.Minute, "a sample of the committed offsets", func() (bool, string) {
		last := s.Last()
		s.mu.Lock()
		defer s.mu.Unlock()
		return last[0] == 6 && last[1] == 6 && len(s.ahead) > 0, fmt.Sprintf("committed %v", last)
	})
	probs := s.problems(t)
	if len(probs) != 1 || !strings.Contains(probs[0], at[pos{0, 5}]+" at offset 5") {
		t.Fatalf("problems %q, want one naming %s at queue 0 offset 5", probs, at[pos{0, 5}])
	}
}
