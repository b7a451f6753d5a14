package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/internal/retry"
)

// errStalled: fetches keep coming back empty although the partition has
// messages past the fetch offset.
var errStalled = errors.New("fetches return nothing below the high watermark")

// errGenerationEnded: the partition's generation ended while its fetcher
// was delivering (its context ends a moment later).
var errGenerationEnded = errors.New("the partition's generation ended")

// stalledAfter is how many such fetches in a row make a connection stalled.
const stalledAfter = 3

// fetch delivers p's messages in offset order, from the group's committed
// offset on, until ctx ends, deliver refuses a message or p's generation
// ends. Every broker request has a deadline: a connection that errs or
// stalls (broker restarted, leader moved, nothing answers) is closed and the
// partition's leader is looked up and dialled again, with backoff.
func (s *Source) fetch(ctx context.Context, p *partition, deliver source.DeliverFunc) {
	offset := p.start
	bo := s.reconnectBackoff()
	for attempt := 0; ; attempt++ {
		if attempt > 0 && retry.Sleep(ctx, bo.NextBackOff()) != nil {
			return
		}
		conn, err := s.dialLeader(ctx, p, attempt)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Log(ctx, failureLevel(attempt+1), "kafka: cannot reach the partition leader; retrying",
				slog.String("partition", p.lane), slog.Int("attempt", attempt+1), slog.Any("error", err))
			continue
		}
		progressed, err := s.read(ctx, conn, p, &offset, deliver)
		conn.Close()
		if ctx.Err() != nil || errors.Is(err, errGenerationEnded) {
			return
		}
		var derr *deliverError
		if errors.As(err, &derr) {
			if !errors.Is(err, consumer.ErrLaneStopped) {
				s.log.Warn("kafka: the consumer refused a message; partition stopped until the next generation",
					slog.String("partition", p.lane), slog.Any("error", err))
			} else {
				s.log.Info("kafka: lane stopped; partition paused until a restart or a rebalance moves it",
					slog.String("partition", p.lane), slog.Int64("offset", offset))
			}
			return
		}
		if progressed {
			attempt = 0
			bo.Reset()
		}
		s.log.Log(ctx, failureLevel(attempt+1), "kafka: fetch failed; reconnecting", slog.String("partition", p.lane),
			slog.Int64("offset", offset), slog.Any("error", err))
	}
}

// failureLevel is the log level of the n-th failure in a row.
func failureLevel(n int) slog.Level {
	if n%logEvery == 1 {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// deliverError is deliver's refusal, told apart from broker errors.
type deliverError struct{ err error }

func (e *deliverError) Error() string { return "deliver: " + e.err.Error() }
func (e *deliverError) Unwrap() error { return e.err }

// read fetches from conn and delivers until an error. It reports whether
// the fetch offset moved.
func (s *Source) read(ctx context.Context, conn *protocol.Conn, p *partition, offset *int64, deliver source.DeliverFunc) (progressed bool, err error) {
	// The connection's calls take no context: closing it is what
	// interrupts them.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	if *offset < 0 {
		if *offset, err = s.resolve(conn, *offset, p); err != nil {
			return false, err
		}
	}
	empty := 0
	for {
		if err := conn.SetDeadline(time.Now().Add(s.cfg.MaxWait + s.cfg.RequestTimeout)); err != nil {
			return progressed, err
		}
		p.fetchAt.Store(time.Now().UnixNano())
		f, err := s.fetchOnce(conn, p, *offset, s.cfg.MaxWait, 1, s.cfg.MaxBytes)
		if errors.Is(err, kafkago.OffsetOutOfRange) {
			to, err := s.resolve(conn, *offset, p)
			if err != nil {
				return progressed, err
			}
			if to < *offset && p.restart(to) { // a new log: see partition
				s.wakeCommitter(p)
			}
			*offset = to
			continue
		}
		if err != nil {
			return progressed, err
		}
		// The connection idles while deliver waits for the lane.
		if err := conn.SetDeadline(time.Time{}); err != nil {
			return progressed, err
		}
		from := *offset
		err = s.deliverFetched(ctx, p, f, offset, deliver)
		if *offset > from {
			progressed = true
			if p.passed(*offset) {
				s.wakeCommitter(p)
			}
		}
		if err != nil {
			return progressed, err
		}
		// Reading committed, the broker returns nothing at or past the last
		// stable offset until the transaction holding it ends.
		end := f.highWatermark
		if !s.cfg.ReadUncommitted && f.lastStableOffset >= 0 {
			end = f.lastStableOffset
		}
		if *offset == from && len(f.batches) > 0 {
			// Batches, but no record at or past the fetch offset: the first
			// batch holds the offset and compaction removed its tail or all
			// its records, and the broker sent nothing after it (it ends a
			// log segment); or the batch starts past the offset.
			switch base := batchBase(f.batches[0]); {
			case base > from && base < end:
				*offset = base // nothing lies between
			case base >= 0 && base <= from:
				if err := conn.SetDeadline(time.Now().Add(s.cfg.RequestTimeout)); err != nil {
					return progressed, err
				}
				if *offset, err = s.batchEnd(conn, p, base, from, f.highWatermark); err != nil {
					return progressed, err
				}
			}
			if *offset > from {
				progressed = true
				if p.passed(*offset) {
					s.wakeCommitter(p)
				}
				continue
			}
		}
		if *offset == from && end > *offset {
			if empty++; empty >= stalledAfter {
				return progressed, fmt.Errorf("%w (offset %d, high watermark %d, last stable offset %d)",
					errStalled, *offset, f.highWatermark, f.lastStableOffset)
			}
		} else {
			empty = 0
		}
	}
}

func (s *Source) wakeCommitter(p *partition) {
	if s.cfg.CommitInterval == 0 {
		p.gen.wakeCommitter()
	}
}

// resolve turns a logical offset (FirstOffset, LastOffset) or an offset out
// of the log's range into a real one.
func (s *Source) resolve(conn *protocol.Conn, offset int64, p *partition) (int64, error) {
	if err := conn.SetDeadline(time.Now().Add(s.cfg.RequestTimeout)); err != nil {
		return offset, err
	}
	// Two requests: a broker refuses two offsets of one partition in one.
	first, err := s.listOffset(conn, p, kafkago.FirstOffset)
	if err != nil {
		return offset, fmt.Errorf("list offsets: %w", err)
	}
	last, err := s.listOffset(conn, p, kafkago.LastOffset)
	if err != nil {
		return offset, fmt.Errorf("list offsets: %w", err)
	}
	reset := first
	if _, retry := s.retryOf[p.topic]; s.cfg.StartFrom == LastOffset && !retry {
		reset = last // a retry topic starts over at its first record (see startGeneration)
	}
	switch {
	case offset == kafkago.FirstOffset:
		return first, nil
	case offset == kafkago.LastOffset:
		return last, nil
	case offset < first:
		s.log.Error("kafka: the committed offset is below the log start: messages were deleted before they were consumed",
			slog.String("partition", p.lane), slog.Int64("offset", offset), slog.Int64("log_start", first))
		return first, nil
	case offset > last:
		s.log.Error("kafka: the offset is past the log end (topic deleted and created again? log truncated?); resetting: the partition's offsets start over",
			slog.String("partition", p.lane), slog.Int64("offset", offset), slog.Int64("log_end", last),
			slog.Int64("reset_to", reset))
		return reset, nil
	default:
		return offset, nil // in range again
	}
}

// deliverFetched delivers the records of f at or past *offset in offset
// order and moves *offset past every record it read: delivered, or passed
// over because it is a transaction marker (never delivered) or, reading
// committed, a record of an aborted transaction.
//
// Reading committed follows Kafka's consumer (KIP-98): the broker returns
// records up to the last stable offset, with the transactions aborted in
// that range, each as its producer ID and first offset. A transactional
// batch of a producer is aborted from that producer's first aborted offset
// until the producer's abort marker.
func (s *Source) deliverFetched(ctx context.Context, p *partition, f *fetched, offset *int64, deliver source.DeliverFunc) error {
	committed := !s.cfg.ReadUncommitted
	var aborting map[int64]bool // producer IDs in an aborted transaction
	next := 0                   // f.aborted[next:] have not started yet
	start := func(upTo int64) {
		for ; next < len(f.aborted) && f.aborted[next].FirstOffset <= upTo; next++ {
			if aborting == nil {
				aborting = make(map[int64]bool)
			}
			aborting[f.aborted[next].ProducerID] = true
		}
	}
	for _, b := range f.batches {
		switch b := b.(type) {
		case *protocol.ControlBatch:
			start(b.BaseOffset)
			for {
				r, err := b.ReadRecord()
				if err != nil {
					break
				}
				off := r.Offset
				cr, err := protocol.ReadControlRecord(r) // closes r's key and value
				if committed && off >= f.lastStableOffset && f.lastStableOffset >= 0 {
					return nil
				}
				if err == nil && cr.Type == controlAbort {
					delete(aborting, b.ProducerID)
				}
				*offset = max(*offset, off+1)
			}
		case *protocol.RecordBatch:
			start(b.BaseOffset)
			skip := committed && b.Attributes.Transactional() && aborting[b.ProducerID]
			if err := s.deliverRecords(ctx, p, f, b, skip, offset, deliver); err != nil {
				return err
			}
		default: // *protocol.MessageSet: the formats before transactions
			if err := s.deliverRecords(ctx, p, f, b, false, offset, deliver); err != nil {
				return err
			}
		}
	}
	return nil
}

// deliverRecords delivers (or, skip, passes over) the records of one batch
// at or past *offset.
func (s *Source) deliverRecords(ctx context.Context, p *partition, f *fetched, b protocol.RecordReader, skip bool, offset *int64, deliver source.DeliverFunc) error {
	for {
		r, err := b.ReadRecord()
		if err != nil {
			return nil // io.EOF; kafka-go decoded the batch before
		}
		if r.Offset < *offset { // a batch may start before the fetch offset
			closeRecord(r)
			continue
		}
		if !s.cfg.ReadUncommitted && f.lastStableOffset >= 0 && r.Offset >= f.lastStableOffset {
			closeRecord(r)
			return nil
		}
		if skip {
			*offset = r.Offset + 1
			closeRecord(r)
			continue
		}
		km, err := kafkaMessage(p, f, r)
		closeRecord(r)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err() // deliver might still take it
		}
		m := p.message(&km)
		if _, retry := s.retryOf[p.topic]; retry && !s.waitDue(ctx, p, m) {
			return ctx.Err() // not delivered: fetched again from *offset
		}
		if !p.push(m) {
			return errGenerationEnded // m is the next owner's
		}
		if err := deliver(ctx, m); err != nil {
			if p.unpush(m) {
				s.signalSettled() // Run may be draining
			}
			return &deliverError{err}
		}
		*offset = km.Offset + 1
	}
}

// kafkaMessage copies r out of the fetch response's buffers.
func kafkaMessage(p *partition, f *fetched, r *protocol.Record) (kafkago.Message, error) {
	km := kafkago.Message{
		Topic:         p.topic,
		Partition:     p.id,
		Offset:        r.Offset,
		HighWaterMark: f.highWatermark,
		Time:          r.Time,
	}
	var err error
	if km.Key, err = readBytes(r.Key); err != nil {
		return km, fmt.Errorf("record %d: key: %w", r.Offset, err)
	}
	if km.Value, err = readBytes(r.Value); err != nil {
		return km, fmt.Errorf("record %d: value: %w", r.Offset, err)
	}
	if len(r.Headers) > 0 {
		km.Headers = make([]kafkago.Header, len(r.Headers))
		for i, h := range r.Headers {
			km.Headers[i] = kafkago.Header{Key: h.Key, Value: h.Value}
		}
	}
	return km, nil
}

// readBytes copies b; empty and null are both nil, as kafka-go's Conn
// reads them.
func readBytes(b protocol.Bytes) ([]byte, error) {
	if b == nil || b.Len() == 0 {
		return nil, nil
	}
	return protocol.ReadAll(b)
}

// closeRecord releases r's key and value to kafka-go's buffer pool.
func closeRecord(r *protocol.Record) {
	if r.Key != nil {
		r.Key.Close()
	}
	if r.Value != nil {
		r.Value.Close()
	}
}

// batchEnd returns the offset after the record batch that starts at base
// and holds from, but no record at or past from. kafka-go decodes a batch's records but not
// its last offset, which lies past its last record when compaction removed
// the batch's tail or all its records (Kafka keeps the batch to keep its
// producer's sequence). The broker answers a fetch at an offset inside the
// batch with the batch again, and a fetch past it with what follows: a
// galloping search finds the first offset past it in a few fetches.
func (s *Source) batchEnd(conn *protocol.Conn, p *partition, base, from, highWatermark int64) (int64, error) {
	inside := func(off int64) (bool, error) {
		f, err := s.fetchOnce(conn, p, off, 0, 0, 1) // at least one batch, at once
		if err != nil {
			return false, err
		}
		return len(f.batches) > 0 && batchBase(f.batches[0]) == base, nil
	}
	lo, hi := from, highWatermark // lo is inside, hi past (the batch ends below the high watermark)
	for step := int64(1); lo+step < hi; step *= 2 {
		in, err := inside(lo + step)
		if err != nil {
			return from, err
		}
		if !in {
			hi = lo + step
			break
		}
		lo += step
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		in, err := inside(mid)
		if err != nil {
			return from, err
		}
		if in {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi, nil
}

func batchBase(b protocol.RecordReader) int64 {
	if b, ok := b.(interface{ Offset() int64 }); ok {
		return b.Offset()
	}
	return -1
}
