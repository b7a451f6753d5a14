package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/fetch"

	"github.com/idemkit/idem/consumer"
)

func dataBatch(producer int64, transactional bool, offsets ...int64) *protocol.RecordBatch {
	recs := make([]protocol.Record, len(offsets))
	for i, off := range offsets {
		recs[i] = protocol.Record{Offset: off, Key: protocol.NewBytes([]byte(fmt.Sprint(off))), Value: protocol.NewBytes([]byte("v"))}
	}
	b := &protocol.RecordBatch{BaseOffset: offsets[0], ProducerID: producer, Records: protocol.NewRecordReader(recs...)}
	if transactional {
		b.Attributes = protocol.Transactional
	}
	return b
}

func marker(producer, offset int64, commit bool) *protocol.ControlBatch {
	cr := protocol.ControlRecord{Offset: offset, Type: controlAbort}
	if commit {
		cr.Type = 1
	}
	return &protocol.ControlBatch{Attributes: protocol.Transactional | protocol.Control, BaseOffset: offset,
		ProducerID: producer, Records: protocol.NewRecordReader(cr.Record())}
}

// One fetch response, read committed and uncommitted: producer 1 aborts
// (0, 1), then commits (4); producer 2 writes outside transactions inside
// the aborted range (2); producer 3's aborted transaction starts at 6, its
// marker comes in a later response. The fetch offset is 1, inside the
// first batch.
func TestDeliverFetchedFiltersTransactions(t *testing.T) {
	response := func() *fetched {
		return &fetched{
			highWatermark:    8,
			lastStableOffset: 8,
			aborted:          []fetch.ResponseTransaction{{ProducerID: 1, FirstOffset: 0}, {ProducerID: 3, FirstOffset: 6}},
			batches: []protocol.RecordReader{
				dataBatch(1, true, 0, 1),
				dataBatch(2, false, 2),
				marker(1, 3, false),
				dataBatch(1, true, 4),
				marker(1, 5, true),
				dataBatch(3, true, 6, 7),
			},
		}
	}
	for _, tc := range []struct {
		uncommitted bool
		want        []int64
	}{
		{false, []int64{2, 4}},
		{true, []int64{1, 2, 4, 6, 7}},
	} {
		t.Run(fmt.Sprintf("ReadUncommitted=%v", tc.uncommitted), func(t *testing.T) {
			s := &Source{cfg: Config{ReadUncommitted: tc.uncommitted}, settled: make(chan struct{}, 1)}
			p := testPartition(1)
			var got []int64
			deliver := func(_ context.Context, m *consumer.Message) error {
				if string(m.Key) != fmt.Sprint(m.Offset) || string(m.Value) != "v" {
					t.Errorf("message %d: key %q, value %q", m.Offset, m.Key, m.Value)
				}
				got = append(got, m.Offset)
				return nil
			}
			offset := int64(1)
			if err := s.deliverFetched(context.Background(), p, response(), &offset, deliver); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) || offset != 8 {
				t.Fatalf("delivered %v and moved to %d, want %v and 8", got, offset, tc.want)
			}
		})
	}
}

// Nothing at or past the last stable offset is delivered or passed over,
// whatever the broker sends.
func TestDeliverFetchedStopsAtTheLastStableOffset(t *testing.T) {
	s := &Source{settled: make(chan struct{}, 1)}
	p := testPartition(0)
	var got []int64
	f := &fetched{highWatermark: 6, lastStableOffset: 3, batches: []protocol.RecordReader{
		dataBatch(1, false, 0, 1), marker(2, 2, true), dataBatch(3, true, 3, 4), marker(3, 5, true),
	}}
	offset := int64(0)
	err := s.deliverFetched(context.Background(), p, f, &offset, func(_ context.Context, m *consumer.Message) error {
		got = append(got, m.Offset)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int64{0, 1}) || offset != 3 {
		t.Fatalf("delivered %v and moved to %d, want [0 1] and 3", got, offset)
	}
}

// A response that starts at a producer's abort marker still lists the
// aborted transaction: the marker ends it, and the producer's next
// transaction is not taken for it.
func TestDeliverFetchedFromAnAbortMarker(t *testing.T) {
	s := &Source{settled: make(chan struct{}, 1)}
	p := testPartition(3)
	var got []int64
	f := &fetched{highWatermark: 6, lastStableOffset: 6,
		aborted: []fetch.ResponseTransaction{{ProducerID: 1, FirstOffset: 0}},
		batches: []protocol.RecordReader{marker(1, 3, false), dataBatch(1, true, 4), marker(1, 5, true)},
	}
	offset := int64(3)
	err := s.deliverFetched(context.Background(), p, f, &offset, func(_ context.Context, m *consumer.Message) error {
		got = append(got, m.Offset)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int64{4}) || offset != 6 {
		t.Fatalf("delivered %v and moved to %d, want [4] and 6", got, offset)
	}
}

// The generation ends while the fetcher delivers a fetch: the committer
// ended the partition, but the fetcher's context ends a moment later, so
// the fetcher goes on to the next record. That record must not be
// delivered: counted as unsettled by an ended partition, whose acks are
// dropped, it kept Run's drain waiting for ever (a scale-out child that
// did not exit after SIGTERM).
func TestDrainEndsWhenTheGenerationEndsMidDelivery(t *testing.T) {
	s := &Source{settled: make(chan struct{}, 1), parts: map[string]*partition{}}
	p := testPartition(0)
	s.parts[p.lane] = p
	f := &fetched{highWatermark: 3, lastStableOffset: 3, batches: []protocol.RecordReader{dataBatch(1, false, 0, 1, 2)}}
	var got []int64
	offset := int64(0)
	err := s.deliverFetched(context.Background(), p, f, &offset, func(ctx context.Context, m *consumer.Message) error {
		got = append(got, m.Offset)
		// The lane takes m and acks it, as a lane with room does.
		if err := s.Ack(ctx, []*consumer.Message{m}); err != nil {
			t.Error(err)
		}
		if m.Offset == 0 { // the generation ends, as commitLoop ends it
			p.end()
			s.signalSettled()
		}
		return nil
	})
	if !errors.Is(err, errGenerationEnded) {
		t.Errorf("deliverFetched: %v, want errGenerationEnded", err)
	}
	if !slices.Equal(got, []int64{0}) {
		t.Errorf("delivered %v, want [0]: nothing after the generation ended", got)
	}

	drained := make(chan struct{})
	go func() {
		s.drain()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		p.mu.Lock()
		n := p.unsettled
		p.mu.Unlock()
		t.Fatalf("drain still waits 10 s after the generation ended: %d unsettled on the ended partition", n)
	}
}
