package kafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/hostport"
)

// StartFrom says where a partition without a committed offset starts.
type StartFrom uint8

const (
	// FirstOffset (the default): the oldest message the broker still has. A
	// new group misses nothing that was produced before it first committed.
	FirstOffset StartFrom = iota
	// LastOffset: the next message produced. A new group skips everything
	// produced before it first committed.
	LastOffset
)

// offset is the kafka-go logical offset of f.
func (f StartFrom) offset() int64 {
	if f == LastOffset {
		return kafkago.LastOffset
	}
	return kafkago.FirstOffset
}

// Kafka's topic names: at most 249 of these characters.
const (
	topicChars  = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
	maxTopicLen = 249
)

// Config configures a Source. Zero values take the documented defaults.
type Config struct {
	// Brokers are the seed brokers, "host:port". Required.
	Brokers []string
	// Topics are the topics the group consumes. Required.
	Topics []string
	// Group is the consumer group (Kafka's group.id); its committed offsets
	// are the consumer's progress. Required.
	Group string

	// StartFrom is where a partition without a committed offset starts;
	// default FirstOffset. It is also where a committed offset past the
	// log's end is reset to (Kafka's auto.offset.reset). It applies to
	// Topics only: their retry topics (RetryDelays) always start at their
	// first record, since each copy there stands for an original that was
	// acknowledged when the copy was written.
	StartFrom StartFrom

	// StartOffsets, when set, is asked on every assignment where the
	// partitions of topic start: a partition whose offset it returns, above
	// the group's committed offset, starts there. With offsets in the store
	// (consumer.Config.Offsets) the store, not the group, knows what was
	// settled — after a crash between the database commit and the group's
	// commit the group's offset is behind — and this spares fetching what
	// the consumer would skip anyway:
	//
	//	StartOffsets: kafka.StoreOffsets(store, "payments") // the consumer's Name
	//
	// (consumer.New refuses a StoreOffsets of another scope than its
	// Config.Name.) An error is logged and the group's offsets are used.
	// Default nil: the group's offsets.
	StartOffsets OffsetStarter

	// ReadUncommitted makes the source read transactional topics as
	// Kafka's isolation.level=read_uncommitted does: records of open and of
	// aborted transactions are delivered too. The default (false) reads
	// committed: a record written in a transaction is delivered only once
	// the transaction committed, never when it aborted, and nothing past
	// the partition's last stable offset (the first record of its oldest
	// open transaction) is delivered before that transaction ended.
	// Records written outside transactions are delivered either way, and
	// transaction markers (control records) never are.
	ReadUncommitted bool

	// TLS, when set, encrypts every connection: group coordination, fetches
	// and offset commits.
	TLS *tls.Config
	// SASL, when set, authenticates every connection, for example
	// plain.Mechanism or scram.Mechanism from kafka-go's sasl packages.
	SASL sasl.Mechanism
	// ClientID is sent to the brokers; default "idem".
	ClientID string
	// DialTimeout bounds opening one connection, TLS and SASL included;
	// default 10s.
	DialTimeout time.Duration

	// MaxBytes bounds one fetch response of one partition; default 1 MiB.
	// A record batch larger than MaxBytes is still returned whole.
	MaxBytes int
	// MaxWait is how long the broker holds a fetch open when it has no new
	// data; default 500ms.
	MaxWait time.Duration
	// RequestTimeout bounds a broker round trip (a fetch: beyond MaxWait)
	// and every group coordinator request, offset commits included;
	// default 10s. A fetch that does not answer in time counts as stalled:
	// its connection is dropped and the partition's leader is looked up and
	// dialled again.
	RequestTimeout time.Duration
	// ReconnectBackoff is the longest pause between two attempts to
	// reconnect a partition; default 5s. Pauses start at 100ms and double.
	ReconnectBackoff time.Duration

	// CommitInterval spaces offset commits. Default 0: a commit starts as
	// soon as an ack moves a partition's watermark, and the acks that arrive
	// while it is in flight go into the next one. A positive value commits
	// at most once per interval: fewer requests, more redelivery after a
	// crash (which the dedup store absorbs).
	CommitInterval time.Duration

	// SessionTimeout is how long the group coordinator waits for a heartbeat
	// before it evicts this member and rebalances; default 30s. The broker
	// bounds it (group.min.session.timeout.ms, default 6s).
	SessionTimeout time.Duration
	// HeartbeatInterval is the time between heartbeats; default 3s. A
	// rebalance is noticed at the next heartbeat.
	HeartbeatInterval time.Duration
	// RebalanceTimeout is how long the coordinator waits for all members to
	// rejoin during a rebalance; default 30s.
	RebalanceTimeout time.Duration
	// JoinGroupBackoff is the pause after a failed attempt to join the
	// group; default 2s.
	JoinGroupBackoff time.Duration
	// PartitionWatchInterval is how often the group looks for partitions
	// added to its topics (and rebalances when it finds some); default 5s;
	// negative turns the watch off.
	PartitionWatchInterval time.Duration

	// DeadLetterTopic is where Source.DeadLetter writes; default the
	// message's topic plus ".dlq". Create it beforehand (or set
	// DeadLetterAutoCreate): a write to a missing topic fails, and the
	// consumer retries it, holding the partition, until it succeeds.
	DeadLetterTopic string
	// DeadLetterAutoCreate lets the broker create a missing dead-letter
	// topic, if the broker allows it (auto.create.topics.enable).
	DeadLetterAutoCreate bool
	// DeadLetterMaxBytes is the largest value copied into a dead letter; a
	// larger one is left out and its SHA-256 and size are in the headers
	// wire.MetaValueSHA256 and wire.MetaValueSize, so that an
	// oversized message cannot block its partition. Default 900 KiB, below
	// the brokers' default message size limit.
	DeadLetterMaxBytes int
	// DeadLetterTimeout bounds one dead-letter write, retries included;
	// default 10s. It bounds a write to a retry topic too.
	DeadLetterTimeout time.Duration

	// RetryDelays, when set, are the delays of the retry topics of
	// consumer.NonBlocking: for each topic of Topics and each delay d, the
	// source also consumes RetryTopic(topic, d) ("payments.retry.10s"),
	// and Source.Retry (a consumer.RetrySink) writes there. A record of a
	// retry topic is delivered only once its wire.MetaRetryDue has
	// passed: its partition's fetcher waits for it, which holds that retry
	// partition only (its records are due in the order they were written).
	// Create the retry topics beforehand (or set DeadLetterAutoCreate),
	// with as many partitions as the topic (a copy goes to the partition
	// of its original's number), and let only the consumer write to them:
	// a retry copy is deduplicated as the message its headers name. Each
	// delay is positive, whole milliseconds, at most 32 of them.
	// Default none: no retry topics.
	RetryDelays []time.Duration

	// CloseTimeout bounds how long Run, once its context ended and the
	// messages in flight are settled, waits to commit and leave the group;
	// default 5s. Past it Run returns and leaving goes on in the background
	// (bounded by RequestTimeout, DialTimeout and RebalanceTimeout). A
	// consumer's Stop deadline should leave room for it.
	CloseTimeout time.Duration

	// Logger receives the source's logs; default slog.Default().
	Logger *slog.Logger
}

func (c *Config) validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf("kafka: Config."+format, args...)) }
	hostport.CheckList("Brokers", c.Brokers, add)
	if len(c.Topics) == 0 {
		add("Topics is empty")
	}
	seen := make(map[string]bool, len(c.Topics))
	for i, t := range c.Topics {
		switch {
		case t == "":
			add("Topics[%d] is empty", i)
		case strings.ContainsRune(t, '/'):
			add("Topics[%d] %q contains '/', which separates the parts of a message ID", i, t)
		case seen[t]:
			add("Topics[%d] %q is listed twice", i, t)
		}
		seen[t] = true
	}
	if c.Group == "" {
		add("Group is empty")
	}
	if c.StartFrom > LastOffset {
		add("StartFrom is %d, not a known start", c.StartFrom)
	}
	if c.MaxBytes < 0 {
		add("MaxBytes is negative (%d)", c.MaxBytes)
	}
	if t := c.DeadLetterTopic; t != "" && (len(t) > maxTopicLen || strings.Trim(t, topicChars) != "") {
		add("DeadLetterTopic %q: want letters, digits, '.', '_' or '-', at most %d bytes", t, maxTopicLen)
	}
	if len(c.RetryDelays) > 32 {
		add("RetryDelays has %d delays, at most 32", len(c.RetryDelays))
	}
	seenDelay := make(map[time.Duration]bool, len(c.RetryDelays))
	for i, d := range c.RetryDelays {
		switch {
		case d <= 0 || d%time.Millisecond != 0:
			add("RetryDelays[%d] is %v, want a positive number of whole milliseconds", i, d)
		case seenDelay[d]:
			add("RetryDelays[%d] %v is listed twice", i, d)
		}
		seenDelay[d] = true
		for _, t := range c.Topics {
			if rt := RetryTopic(t, d); len(rt) > maxTopicLen {
				add("RetryDelays[%d]: retry topic %q is longer than %d bytes", i, rt, maxTopicLen)
			} else if seen[rt] {
				add("Topics lists %q, a retry topic of RetryDelays[%d]: list the topics, not their retry topics", rt, i)
			}
		}
	}
	if c.DeadLetterMaxBytes < 0 {
		add("DeadLetterMaxBytes is negative (%d)", c.DeadLetterMaxBytes)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"DialTimeout", c.DialTimeout}, {"MaxWait", c.MaxWait}, {"RequestTimeout", c.RequestTimeout},
		{"ReconnectBackoff", c.ReconnectBackoff}, {"CommitInterval", c.CommitInterval},
		{"SessionTimeout", c.SessionTimeout}, {"HeartbeatInterval", c.HeartbeatInterval},
		{"RebalanceTimeout", c.RebalanceTimeout}, {"JoinGroupBackoff", c.JoinGroupBackoff},
		{"DeadLetterTimeout", c.DeadLetterTimeout}, {"CloseTimeout", c.CloseTimeout},
	} {
		if d.v < 0 {
			add("%s is negative (%v)", d.name, d.v)
		}
	}
	if session, hb := c.sessionTimeout(), c.HeartbeatInterval; hb >= session {
		add("HeartbeatInterval (%v) must be shorter than SessionTimeout (%v)", hb, session)
	}
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	c.ClientID = cmp.Or(c.ClientID, "idem")
	c.DialTimeout = cmp.Or(c.DialTimeout, 10*time.Second)
	c.MaxBytes = cmp.Or(c.MaxBytes, 1<<20)
	c.MaxWait = cmp.Or(c.MaxWait, 500*time.Millisecond)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, 10*time.Second)
	c.ReconnectBackoff = cmp.Or(c.ReconnectBackoff, 5*time.Second)
	c.SessionTimeout = c.sessionTimeout()
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, min(3*time.Second, c.SessionTimeout/3))
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, 30*time.Second)
	c.JoinGroupBackoff = cmp.Or(c.JoinGroupBackoff, 2*time.Second)
	c.PartitionWatchInterval = cmp.Or(c.PartitionWatchInterval, 5*time.Second)
	c.DeadLetterMaxBytes = cmp.Or(c.DeadLetterMaxBytes, 900<<10)
	c.DeadLetterTimeout = cmp.Or(c.DeadLetterTimeout, 10*time.Second)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, 5*time.Second)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

func (c *Config) sessionTimeout() time.Duration {
	if c.SessionTimeout == 0 {
		return 30 * time.Second
	}
	return c.SessionTimeout
}

// dialer builds the kafka-go Dialer every connection of the source uses.
func (c *Config) dialer() *kafkago.Dialer {
	return &kafkago.Dialer{
		ClientID:      c.ClientID,
		Timeout:       c.DialTimeout,
		DualStack:     true,
		KeepAlive:     30 * time.Second,
		TLS:           c.TLS,
		SASLMechanism: c.SASL,
	}
}

func (c *Config) groupConfig(d *kafkago.Dialer, log *slog.Logger) kafkago.ConsumerGroupConfig {
	gc := kafkago.ConsumerGroupConfig{
		ID:                c.Group,
		Brokers:           c.Brokers,
		Dialer:            d,
		Topics:            c.Topics,
		HeartbeatInterval: c.HeartbeatInterval,
		SessionTimeout:    c.SessionTimeout,
		RebalanceTimeout:  c.RebalanceTimeout,
		JoinGroupBackoff:  c.JoinGroupBackoff,
		// The source watches partitions itself (watchPartitions): kafka-go's
		// watcher ends the generation when a topic is missing, and kafka-go
		// then rejoins without pause, in a tight loop.
		WatchPartitionChanges: false,
		StartOffset:           c.StartFrom.offset(),
		Timeout:               c.RequestTimeout,
		// kafka-go's own account of joins, syncs and leaves; the source logs
		// what matters (generations, errors) itself.
		ErrorLogger: kafkago.LoggerFunc(func(format string, args ...any) {
			log.Debug("kafka-go: " + fmt.Sprintf(format, args...))
		}),
	}
	return gc
}

// OffsetStarter says where the partitions of topic start
// (Config.StartOffsets): the offsets of the partitions it knows. StoreOffsets
// makes the one a consumer with offsets in its store wants.
type OffsetStarter interface {
	StartOffsets(ctx context.Context, topic string) (map[int32]int64, error)
}

// StoreOffsets returns a Config.StartOffsets that starts each partition at
// the next offset store keeps for the consumer named scope. The Source
// says which scope it reads (source.Description.ReadsScopes), and consumer.New
// refuses it unless scope is its Config.Name.
func StoreOffsets[TTx any](store dedup.OffsetStore[TTx], scope string) OffsetStarter {
	return storeOffsets{store: store, scope: scope}
}

type storeOffsets struct {
	store interface {
		NextOffsets(ctx context.Context, scope, topic string) (map[int32]int64, error)
	} // dedup.OffsetStore's, whatever its transaction type
	scope string
}

func (s storeOffsets) StartOffsets(ctx context.Context, topic string) (map[int32]int64, error) {
	return s.store.NextOffsets(ctx, s.scope, topic)
}
