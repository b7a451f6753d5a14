package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer"
)

// errStalled: fetches keep coming back empty although the partition has
// messages past the fetch offset.
var errStalled = errors.New("fetches return nothing below the high watermark")

// stalledAfter is how many such fetches in a row make a connection stalled.
const stalledAfter = 3

// fetch delivers p's messages in offset order, from the group's committed
// offset on, until ctx ends or deliver refuses a message. Every broker
// request has a deadline: a connection that errs or stalls (broker
// restarted, leader moved, nothing answers) is closed and the partition's
// leader is looked up and dialled again, with backoff.
func (s *Source) fetch(ctx context.Context, p *partition, deliver consumer.DeliverFunc) {
	offset := p.start
	var buf []kafkago.Message
	bo := s.reconnectBackoff()
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !sleep(ctx, bo.NextBackOff()) {
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
		progressed, err := s.read(ctx, conn, p, &offset, deliver, &buf)
		conn.Close()
		if ctx.Err() != nil {
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

// dialLeader connects to p's leader, asking the seed brokers in turn.
func (s *Source) dialLeader(ctx context.Context, p *partition, attempt int) (*kafkago.Conn, error) {
	var errs []error
	n := len(s.cfg.Brokers)
	for i := range n {
		b := s.cfg.Brokers[(attempt+i)%n]
		conn, err := s.dialer.DialLeader(ctx, "tcp", b, p.topic, p.id)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, fmt.Errorf("via %s: %w", b, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// read fetches from conn and delivers until an error. It reports whether it
// delivered anything.
func (s *Source) read(ctx context.Context, conn *kafkago.Conn, p *partition, offset *int64, deliver consumer.DeliverFunc, buf *[]kafkago.Message) (progressed bool, err error) {
	// Conn's calls take no context: closing it is what interrupts them.
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
		if _, err := conn.Seek(*offset, kafkago.SeekAbsolute|kafkago.SeekDontCheck); err != nil {
			return progressed, err
		}
		batch := conn.ReadBatchWith(kafkago.ReadBatchConfig{MinBytes: 1, MaxBytes: s.cfg.MaxBytes, MaxWait: s.cfg.MaxWait})
		msgs := (*buf)[:0]
		for {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			msgs = append(msgs, m)
		}
		hwm, next := batch.HighWaterMark(), batch.Offset()
		berr := batch.Close()
		*buf = msgs
		switch {
		case berr == nil, errors.Is(berr, kafkago.RequestTimedOut):
			// RequestTimedOut: nothing new within MaxWait.
		case errors.Is(berr, kafkago.OffsetOutOfRange):
			if *offset, err = s.resolve(conn, *offset, p); err != nil {
				return progressed, err
			}
			continue
		case len(msgs) == 0:
			return progressed, berr
		}
		// The connection idles while deliver waits for the lane.
		if err := conn.SetDeadline(time.Time{}); err != nil {
			return progressed, err
		}
		for i := range msgs {
			if msgs[i].Offset < *offset {
				continue // a batch may start before the requested offset
			}
			if ctx.Err() != nil {
				return progressed, ctx.Err() // deliver might still take it
			}
			m := p.message(&msgs[i])
			p.push(m)
			if err := deliver(ctx, m); err != nil {
				if p.unpush(m) {
					s.signalSettled() // Run may be draining
				}
				clear(msgs)
				return progressed, &deliverError{err}
			}
			*offset = msgs[i].Offset + 1
			progressed = true
		}
		clear(msgs) // the lane holds what it needs
		if berr != nil && !errors.Is(berr, kafkago.RequestTimedOut) {
			return progressed, berr
		}
		if next > *offset {
			*offset = next // past compacted or skipped records
		}
		if len(msgs) == 0 && hwm > *offset {
			if empty++; empty >= stalledAfter {
				return progressed, fmt.Errorf("%w (offset %d, high watermark %d)", errStalled, *offset, hwm)
			}
		} else {
			empty = 0
		}
	}
}

// resolve turns a logical offset (FirstOffset, LastOffset) or an offset out
// of the log's range into a real one.
func (s *Source) resolve(conn *kafkago.Conn, offset int64, p *partition) (int64, error) {
	if err := conn.SetDeadline(time.Now().Add(s.cfg.RequestTimeout)); err != nil {
		return offset, err
	}
	first, last, err := conn.ReadOffsets()
	if err != nil {
		return offset, fmt.Errorf("read offsets: %w", err)
	}
	reset := first
	if s.cfg.StartOffset == LastOffset {
		reset = last
	}
	switch {
	case offset == FirstOffset:
		return first, nil
	case offset == LastOffset:
		return last, nil
	case offset < first:
		s.log.Error("kafka: the committed offset is below the log start: messages were deleted before they were consumed",
			slog.String("partition", p.lane), slog.Int64("offset", offset), slog.Int64("log_start", first))
		return first, nil
	case offset > last:
		s.log.Error("kafka: the committed offset is past the log end (log truncated?); resetting",
			slog.String("partition", p.lane), slog.Int64("offset", offset), slog.Int64("log_end", last),
			slog.Int64("reset_to", reset))
		return reset, nil
	default:
		return offset, nil // in range again
	}
}
