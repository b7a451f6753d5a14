package retrytest

import (
	"context"
	"sync"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/consumer/wire"
)

// LoopSource is a consumertest.Source whose topic "pay.retry" is the
// retry topic of "pay": a copy is delivered once due, and keyed as its
// original (source.Description.RetryOf). LoopSink writes its copies.
type LoopSource struct{ *consumertest.Source }

// Run delivers the source's messages, a retry copy not before it is due.
func (s LoopSource) Run(ctx context.Context, deliver source.DeliverFunc) error {
	return s.Source.Run(ctx, func(ctx context.Context, m *consumer.Message) error {
		if due, ok := wire.RetryDue(m); ok && m.Topic == "pay.retry" {
			t := time.NewTimer(min(time.Until(due), 10*time.Second))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		return deliver(ctx, m)
	})
}

// Describe says that pay.retry is the retry topic of pay.
func (s LoopSource) Describe() source.Description {
	d := s.Source.Describe()
	d.RetryOf = func(topic string) (string, bool) { return "pay", topic == "pay.retry" }
	return d
}

// LoopSink is a consumer.RetrySink that writes a copy back to Src as a
// record of pay.retry, partition 0, keeping its record key, as a broker
// would.
type LoopSink struct {
	Src    LoopSource
	mu     sync.Mutex
	offset int64
}

// Retry pushes r's record to Src.
func (s *LoopSink) Retry(_ context.Context, r consumer.RetryLetter) error {
	headers, value := wire.Letter(r.Letter).RetryRecord(r.Retry)
	s.mu.Lock()
	m := consumertest.Message("pay.retry", 0, s.offset, string(r.Message.Key), string(value))
	s.offset++
	s.mu.Unlock()
	m.Headers = headers
	s.Src.Push(m)
	return nil
}
