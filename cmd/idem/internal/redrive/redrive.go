package redrive

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// What Run did with a letter (Result.Action).
const (
	Sent      = "sent"
	WouldSend = "would_send" // Config.DryRun
	Refused   = "refused"    // its queue stops there
	Skipped   = "skipped"    // refused, and passed by (Config.Skip)
)

// DefaultGroup is the group whose committed offsets say where the last
// redrive stopped, when Config.Group is empty.
const DefaultGroup = "idem-redrive"

// DefaultMaxRedrives is Config.MaxRedrives' default.
const DefaultMaxRedrives = 5

// Config is what a redrive does.
type Config struct {
	// Admin is the dedup store's: Run looks each letter's key up in it
	// (Find) and, with Release, releases it. Required.
	Admin dedup.Admin
	// Topic is the dead-letter topic to read. Required.
	Topic string
	// To sends every letter to this topic; default each letter's original
	// topic (consumer.MetaTopic). A copy sent elsewhere is a new message
	// there: the consumer does not honour its lineage.
	To string
	// Group is the consumer group whose committed offsets of Topic say
	// where the last redrive stopped; default DefaultGroup.
	Group string
	// Max bounds the letters handled in one run; 0: up to the end.
	Max int
	// MaxRedrives refuses a letter redriven this many times already;
	// default DefaultMaxRedrives.
	MaxRedrives int
	// Release releases a letter's failed key on the way (as idem release
	// does) instead of refusing the letter.
	Release bool
	// DryRun decides about each letter and sends, releases and commits
	// nothing.
	DryRun bool
	// Skip passes refused letters by (commits past them) instead of
	// stopping their queue.
	Skip bool
}

// Result is what Run did with one dead letter. Its JSON is `idem redrive
// --json`'s.
type Result struct {
	Letter  string `json:"letter"` // the letter's position: dlq/partition/offset (Kafka), dlq/broker/queue/offset (RocketMQ)
	Scope   string `json:"scope,omitempty"`
	Key     string `json:"key,omitempty"`
	To      string `json:"to,omitempty"`    // topic/partition (Kafka); topic, and once sent topic/broker/queue (RocketMQ)
	Action  string `json:"action"`          // Sent, WouldSend, Refused, Skipped
	Cause   string `json:"cause,omitempty"` // the letter's idem-cause (consumer.MetaCause): why it was dead-lettered
	Reason  string `json:"reason,omitempty"`
	Count   int    `json:"redrive_count,omitempty"`
	Release bool   `json:"released,omitempty"` // its failed row was released on the way (Config.Release)
}

// Broker is where the dead-letter topic lies: Kafka or RocketMQ.
type Broker interface {
	// Name is the broker's kind, "kafka" or "rocketmq".
	Name() string
	open(ctx context.Context, topic, group string) (session, error)
}

// session is one run's connection to a broker. Its methods are called from
// one goroutine.
type session interface {
	// queues returns the parts of the topic with letters this run reads:
	// from the group's committed offset (or the first letter the broker
	// still has) to the end as it is now, in a fixed order.
	queues(ctx context.Context) ([]queue, error)
	// read hands the letters of q from q.from, in order, to each until each
	// returns false or an error, or the next letter lies at q.to or after.
	read(ctx context.Context, q queue, each func(letter) (bool, error)) error
	// target says where c goes, before it is sent.
	target(c *message) string
	// send sends c and returns where it went.
	send(ctx context.Context, c *message) (string, error)
	// commit commits next as the group's offset of q: where the next run
	// starts.
	commit(ctx context.Context, q queue, next int64) error
	close()
}

// queue is the part [from, to) of one partition (Kafka) or queue
// (RocketMQ) of the topic that this run reads.
type queue struct {
	from, to int64
	ref      any // the session's name of the partition or queue
}

// letter is a dead letter as a session read it.
type letter struct {
	pos        string // Result.Letter
	offset     int64
	key, value []byte
	headers    []consumer.Header
	raw        any // the session's message
}

func (l *letter) header(name string) (string, bool) {
	for _, h := range l.headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

// message is the copy of a letter that goes back.
type message struct {
	topic      string
	partition  int // the original's partition or queue ID (consumer.MetaPartition)
	key, value []byte
	headers    []consumer.Header
	letter     *letter
}

// Run redrives cfg.Topic's letters on b: from where the last redrive of
// cfg.Group stopped to the topic's end as it was when Run started, at most
// cfg.Max of them. Each letter is refused or sent back with its lineage,
// and the group's offset committed past it once it was sent (or skipped):
// a run cut off between the two sends the letter again next time, which
// the consumer deduplicates by the lineage (or Run refuses, by the
// original's done row). A queue stops at a refused letter unless cfg.Skip.
// The results say what was done even when Run returns an error.
func Run(ctx context.Context, b Broker, cfg Config) ([]Result, error) {
	switch {
	case cfg.Admin == nil:
		return nil, errors.New("redrive: Config.Admin is required")
	case cfg.Topic == "":
		return nil, errors.New("redrive: Config.Topic (the dead-letter topic) is required")
	case cfg.Max < 0:
		return nil, fmt.Errorf("redrive: Config.Max %d is negative", cfg.Max)
	case cfg.MaxRedrives < 0:
		return nil, fmt.Errorf("redrive: Config.MaxRedrives %d is negative", cfg.MaxRedrives)
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.MaxRedrives == 0 {
		cfg.MaxRedrives = DefaultMaxRedrives
	}
	s, err := b.open(ctx, cfg.Topic, cfg.Group)
	if err != nil {
		return nil, err
	}
	defer s.close()
	qs, err := s.queues(ctx)
	if err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, s: s}
	var out []Result
	for _, q := range qs {
		left := 0
		if cfg.Max > 0 {
			if left = cfg.Max - len(out); left == 0 {
				break
			}
		}
		res, err := r.queue(ctx, q, left)
		out = append(out, res...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

type run struct {
	cfg Config
	s   session
}

// queue redrives the letters of q, at most limit of them (0: all), and
// commits the group's offset past each one it sent or skipped.
func (r *run) queue(ctx context.Context, q queue, limit int) ([]Result, error) {
	var out []Result
	err := r.s.read(ctx, q, func(l letter) (bool, error) {
		res, err := r.letter(ctx, &l)
		out = append(out, res)
		if err != nil {
			return false, err
		}
		if !r.cfg.DryRun {
			if res.Action == Refused {
				return false, nil // the queue stops at a refused letter: the next run starts with it
			}
			if err := r.s.commit(ctx, q, l.offset+1); err != nil {
				return false, err
			}
		}
		return limit == 0 || len(out) < limit, nil
	})
	return out, err
}

// letter decides about one dead letter and, unless refused, sends it back.
func (r *run) letter(ctx context.Context, l *letter) (Result, error) {
	res := Result{Letter: l.pos}
	refuse := func(format string, args ...any) (Result, error) {
		res.Action, res.Reason = Refused, fmt.Sprintf(format, args...)
		if r.cfg.Skip && !r.cfg.DryRun {
			res.Action = Skipped
		}
		return res, nil
	}
	res.Cause, _ = l.header(consumer.MetaCause)
	res.Scope, _ = l.header(consumer.MetaKeyScope)
	res.Key, _ = l.header(consumer.MetaKey)
	to := r.cfg.To
	if to == "" {
		to, _ = l.header(consumer.MetaTopic)
	}
	partition, _ := l.header(consumer.MetaPartition)
	p, perr := strconv.Atoi(partition)
	count := 0
	if c, ok := l.header(consumer.MetaRedriveCount); ok {
		count, _ = strconv.Atoi(c)
	}
	res.Count = count + 1
	_, leftOut := l.header(consumer.MetaValueSHA256)
	switch {
	case to == "":
		return refuse("no %s header: not an idem dead letter (use --to)", consumer.MetaTopic)
	case perr != nil:
		return refuse("no valid %s header", consumer.MetaPartition)
	case res.Scope == "" || res.Key == "":
		return refuse("no key: it was dead-lettered before its key was known (bad input); it would fail the same way")
	case count >= r.cfg.MaxRedrives:
		// Before the value's case, so that a letter without a value (a
		// tombstone, an empty body), which is sent on, is refused too.
		return refuse("redriven %d times already (--max-redrives)", count)
	case leftOut:
		return refuse("its value was left out of the dead letter (too large)")
	}
	c := &message{topic: to, partition: p, key: l.key, value: l.value, letter: l}
	res.To = r.s.target(c)
	rows, err := r.cfg.Admin.Find(ctx, res.Scope, res.Key)
	if err != nil {
		return res, err
	}
	for _, row := range rows {
		switch row.Outcome {
		case "done":
			return refuse("the key was applied (a done row): sent back, it would be skipped as a duplicate or refused as a mismatch")
		case "failed":
			if !r.cfg.Release {
				return refuse("the key is recorded as failed: release it first (idem release --scope %s %s), or use --release", res.Scope, res.Key)
			}
			if !r.cfg.DryRun {
				if _, err := r.cfg.Admin.Release(ctx, []dedup.Key{row.Key}, false); err != nil {
					return res, err
				}
			}
			res.Release = true
		}
	}
	if r.cfg.DryRun {
		res.Action = WouldSend
		return res, nil
	}
	c.headers = lineage(l, res.Count)
	at, err := r.s.send(ctx, c)
	if err != nil {
		return res, err
	}
	res.To, res.Action = at, Sent
	return res, nil
}

// lineage returns the headers of a letter's copy: the message's own headers
// (traceparent included), its original coordinates, message ID and key,
// and the redrive's count and the letter it came from — without the
// letter's own metadata (its reason, cause, fingerprint, attempts, lane).
func lineage(l *letter, count int) []consumer.Header {
	headers := make([]consumer.Header, 0, len(l.headers)+2)
	for _, h := range l.headers {
		switch h.Key {
		case consumer.MetaReason, consumer.MetaCause, consumer.MetaFingerprint, consumer.MetaAttempts, consumer.MetaAttempt, consumer.MetaLane,
			consumer.MetaRedriveCount, consumer.MetaRedrivenFrom:
			// the letter's own, or replaced below
		default:
			headers = append(headers, h)
		}
	}
	return append(headers,
		consumer.Header{Key: consumer.MetaRedriveCount, Value: []byte(strconv.Itoa(count))},
		consumer.Header{Key: consumer.MetaRedrivenFrom, Value: []byte(l.pos)})
}
