package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// Record is an outbox row on its way to the broker.
type Record struct {
	Seq      int64     // the row's place in the outbox: publication order within a shard
	ID       string    // MessageID(Parent, Position); also in Headers as HeaderID
	Parent   dedup.Key // the key of the work that enqueued it
	Position int
	Topic    string
	Key      []byte
	Value    []byte
	// Headers are the message's own, then HeaderID, HeaderScope, HeaderKey
	// and HeaderPosition.
	Headers []consumer.Header
	Created time.Time // when it was enqueued, by the database clock
}

// Publisher sends records to a broker. Publish sends recs and sets errs[i]
// (len(errs) == len(recs), all nil on entry) to what became of recs[i]:
//
//   - nil: the broker has it durably (Kafka: acknowledged by all in-sync
//     replicas; RocketMQ: SEND_OK). The relay then marks it sent.
//   - an error wrapping ErrRefused (see Refused): the broker refused this
//     record on its own, for good — too large, a topic name it cannot
//     have. The relay moves it to the dead-letter table with the reason.
//     A publisher that sends several records at once and has them refused
//     together must find out which one is at fault (send them one by one)
//     before it says so.
//   - any other error: it may succeed later (broker down, leader moving,
//     timeout, unknown topic). The row stays and is published again after
//     a backoff. Its outcome may also be unknown (a timeout after the
//     broker stored it): publishing again is what the ID is for.
//
// Publish keeps per-key order: it sends a record only after every earlier
// record of recs with the same Topic and Key was sent (nil); a record held
// back because an earlier one of its key failed gets an error too. It must
// return when ctx ends. The relay calls Publish from one goroutine at a time.
type Publisher interface {
	Publish(ctx context.Context, recs []Record, errs []error)
}

// ErrRefused marks a record the broker refused for good; see Publisher.
var ErrRefused = errors.New("refused by the broker")

// Refused wraps err as a refusal: errors.Is(Refused(err), ErrRefused).
func Refused(err error) error { return fmt.Errorf("%w: %w", ErrRefused, err) }

// ErrHeldBack is the error of a record a publisher did not send because an
// earlier record of its key failed.
var ErrHeldBack = errors.New("held back: an earlier message of its key was not sent")

// PublisherFunc adapts a function to Publisher.
type PublisherFunc func(ctx context.Context, recs []Record, errs []error)

func (f PublisherFunc) Publish(ctx context.Context, recs []Record, errs []error) { f(ctx, recs, errs) }

// OrderKey names a record's order: records with equal order keys are
// published in order. Publishers group by it.
func (r *Record) OrderKey() string {
	if r.Key == nil {
		return "\x00" + r.ID // no order: a group of its own
	}
	return r.Topic + "\x1f" + string(r.Key)
}
