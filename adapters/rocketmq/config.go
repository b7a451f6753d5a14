package rocketmq

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"
)

// StartFrom says where a consumer group without a committed offset starts.
type StartFrom uint8

const (
	// FirstOffset (the default): the oldest message the broker still has. A
	// new group misses nothing that was produced before it first committed.
	FirstOffset StartFrom = iota
	// LastOffset: the next message produced. RocketMQ itself still starts a
	// brand-new group at 0 when the queue's first message is in page cache.
	LastOffset
)

// DeadLetterMode says where Source.DeadLetter puts a message the consumer
// gave up on.
type DeadLetterMode uint8

const (
	// DeadLetterTopic (the default) produces the letter to idem's own
	// dead-letter topic (Config.DeadLetterTopic): the original body, KEYS,
	// TAGS and user properties, and the metadata every idem adapter puts on
	// a letter (wire.MetaReason, MetaAttempts, MetaTopic, ...: the
	// reason, the attempts, the original queue, offset and message ID, the
	// dedup key) as properties. It returns once the broker stored it.
	DeadLetterTopic DeadLetterMode = iota
	// DeadLetterBroker hands the message to the broker's dead-letter queue
	// %DLQ%<group>: its consume call returns "retry later" with delay level
	// -1 (concurrent mode) or is suspended with its reconsume count past the
	// maximum (orderly mode), and the client's send-back moves the original
	// message, unchanged, to %DLQ%<group>. The reason is only logged. Needs
	// BatchMaxSize 1, see Config.BatchMaxSize.
	DeadLetterBroker
)

// Config configures a Source. Zero values take the documented defaults.
type Config struct {
	// NameServers are the name servers, "host:port". Required: idem never
	// lets the client fall back to its default resolver, which fetches the
	// name server list from a remote HTTP endpoint.
	NameServers []string
	// Group is the consumer group; its offsets on the broker are the
	// consumer's progress. Required; letters, digits, '_', '-', '%' and '|',
	// at most 255 bytes.
	Group string
	// Topics are the subscribed topics. Required; letters, digits, '_',
	// '-', '%' and '|', at most 127 bytes each. Create them before Run: the
	// push consumer refuses to start on a topic the name server does not
	// know.
	Topics []string
	// Tags is the tag expression of every subscription, for example
	// "paid || refunded"; default "*" (all messages).
	Tags string

	// Orderly consumes each queue in order, one consume call at a time, with
	// the queue locked on the broker (RocketMQ's orderly mode). Default:
	// concurrent mode, where up to ConsumeGoroutines calls per topic run at
	// once and order within a queue is not kept (consumer.New refuses
	// consumer.NonBlocking.KeyOrdered then).
	Orderly bool
	// StartFrom is where a group without a committed offset starts; default
	// FirstOffset. It applies to Topics only: with RetryDelays, Run commits
	// the first offset of every retry queue the group has none for before
	// it starts, so that a retry topic starts at its first message.
	StartFrom StartFrom

	// BatchMaxSize is the most messages the client hands to one consume call
	// (ConsumeMessageBatchMaxSize), 1..1024. The call's messages go to the
	// consumer's lane together and usually commit in one transaction; the
	// call's result (success or retry later) covers all of them. Default 32,
	// and 1 with DeadLetterBroker, which requires 1: the broker's DLQ move
	// applies to every message of a call, and this client has no ackIndex to
	// split a call's result.
	BatchMaxSize int
	// PullBatchSize is the most messages pulled from a queue at once,
	// 1..1024; default 32.
	PullBatchSize int
	// ConsumeGoroutines bounds the consume calls in flight per topic in
	// concurrent mode, 1..100000; default 64 (the client's own default is
	// 20). Each call blocks until its messages are settled, so at most
	// ConsumeGoroutines × BatchMaxSize messages are in flight, and that is
	// what the consumer's lanes can batch together: for full batches of
	// BatchSize over Q queues, want about 2 × Q × BatchSize. With 20 × 32 the
	// lanes of 8 queues held about 80 messages each and transactions
	// averaged 49 messages; with 64, 96 (docs/benchmarks.md).
	ConsumeGoroutines int

	// MaxReconsumeTimes is how often a message given back with "retry later"
	// (see the package doc: released on shutdown, stopped lane) is delivered
	// again before the broker moves it to %DLQ%<group>; default 16. In
	// orderly mode this client retries locally instead and the same bound
	// applies. The consumer's own retries (consumer.Config.Retry) do not
	// count: they happen inside one delivery.
	MaxReconsumeTimes int
	// RetryDelayLevel is the delay level of a message given back in
	// concurrent mode (DelayLevelWhenNextConsume); default 0: the broker's
	// schedule, level 3 + reconsume times (10s, 30s, 1m, ... with the
	// default messageDelayLevel). 1..18 pick a level of the broker's
	// messageDelayLevel.
	RetryDelayLevel int
	// SuspendTime is how long an orderly queue pauses after a call was
	// given back before the client hands the same messages over again;
	// default 1s, at most 30s. (The client's own default is no pause at all:
	// a tight loop.)
	SuspendTime time.Duration
	// ConsumeTimeout is the client's ConsumeTimeout (concurrent mode): a
	// message still being consumed after it is sent back to the retry topic
	// and its offset moves on; the copy is later skipped as a duplicate if
	// the first run committed. Default 15m.
	ConsumeTimeout time.Duration

	// DeadLetter says where Source.DeadLetter puts messages; default
	// DeadLetterTopic.
	DeadLetter DeadLetterMode
	// DeadLetterTopic is idem's dead-letter topic (DeadLetterTopic mode);
	// default the message's topic plus "_DLQ" (a retry copy's: its
	// original's topic plus "_DLQ"). Create it beforehand unless
	// the broker auto-creates topics: a send to a missing topic fails and the
	// consumer retries it, holding the queue, until it succeeds.
	DeadLetterTopic string
	// DeadLetterMaxBytes is the largest body copied into a dead letter; a
	// larger one is left out (the letter's body is a note saying so: the
	// broker refuses empty bodies) and its SHA-256 and size are in the
	// properties wire.MetaValueSHA256 and wire.MetaValueSize, so
	// that an oversized message cannot block its queue. Default 4 MiB minus 64 KiB, below the broker's default
	// maxMessageSize.
	DeadLetterMaxBytes int
	// DeadLetterTimeout bounds one dead-letter send, retries included;
	// default 10s. It bounds a send to a retry topic too.
	DeadLetterTimeout time.Duration

	// RetryDelays, when set, are the delays of the retry copies of
	// consumer.NonBlocking: the source also consumes RetryTopic(topic)
	// ("payments_RETRY") for each of Topics, and Source.Retry (a
	// consumer.RetrySink) produces there, as a timer message the broker
	// delivers after the copy's delay. Create the retry topics beforehand,
	// with as many queues as their topics, and let only the consumer
	// produce to them: a message there is deduplicated as the message its
	// properties name. Each delay is positive, whole milliseconds, at most
	// 3 days (the broker's timerMaxDelaySec default), and the broker must
	// have its timer wheel on (timerWheelEnable, the RocketMQ 5 default).
	// At most 32 delays. Default none: no retry topics.
	RetryDelays []time.Duration

	// AccessKey, SecretKey and SecurityToken authenticate to brokers with
	// ACL enabled. The client's TLS mode skips certificate verification, so
	// idem does not offer it: protect the network instead.
	AccessKey, SecretKey, SecurityToken string
	// InstanceName tells this client apart from others in the group; default
	// a name unique in this process ("idem-<pid>-<n>"). Two Sources in one
	// process must not share one.
	InstanceName string
	// CloseTimeout bounds the push consumer's shutdown (unlock orderly
	// queues, persist offsets, unregister) once Run's context ended and the
	// messages in flight are settled; default 10s. Past it Run returns and
	// the shutdown goes on in the background.
	CloseTimeout time.Duration
	// RouteWait bounds how long Run keeps starting again while a topic has
	// no route on the name servers: a topic not created yet, or routes a
	// name server dropped for a while (it forgets a broker's topics the
	// moment the broker's connection closes, until the broker registers
	// again, every 30 s). The client refuses to start without a route; Run
	// logs each refusal, tries again with backoff and, past RouteWait,
	// returns the client's error, which names the topic. Default 1m;
	// negative: return it at once.
	RouteWait time.Duration
	// GroupCheck is how often the Source reads from the brokers, for each
	// queue of Topics, the queue's last offset and the group's committed
	// offset, so that Lanes — and with it consumer.Health, /healthz and the
	// stalled-lanes gauge — reports a queue that no process of the group
	// consumes. The members split the queues among themselves, each from its
	// own view of the group; a queue left out of every view has no process
	// whose process queues would show it. Such a queue (not held here,
	// messages behind its committed offset, which stood still for two
	// checks) is reported as a lane with Waiting the messages behind and
	// LastSettled when its committed offset last moved; every member
	// reports it. Default 30s; negative: off. Off with AccessKey: the check
	// does not sign its requests.
	GroupCheck time.Duration

	// Logger receives the source's own logs; default slog.Default(). The
	// client library's own logs are not the source's: they go where the
	// library's process-wide logger sends them, which SetClientLogger
	// routes into slog.
	Logger *slog.Logger
}

var (
	// RocketMQ's own character set for topic and group names.
	nameRE = regexp.MustCompile(`^[%|a-zA-Z0-9_-]+$`)
	// instances numbers default instance names within the process.
	instances atomic.Int64
)

const (
	maxTopicLen = 127
	maxGroupLen = 255
)

func (c *Config) validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf("rocketmq: Config."+format, args...)) }
	if len(c.NameServers) == 0 {
		add("NameServers is empty: name the name servers (host:port); the client's default resolver reaches for a remote HTTP endpoint")
	}
	for i, ns := range c.NameServers {
		host, port, err := net.SplitHostPort(ns)
		if err != nil || host == "" {
			add("NameServers[%d] %q: want host:port", i, ns)
			continue
		}
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			add("NameServers[%d] %q: bad port", i, ns)
		}
	}
	switch {
	case c.Group == "":
		add("Group is empty")
	case len(c.Group) > maxGroupLen:
		add("Group is %d bytes, the limit is %d", len(c.Group), maxGroupLen)
	case !nameRE.MatchString(c.Group):
		add("Group %q: want letters, digits, '_', '-', '%%' or '|'", c.Group)
	}
	if len(c.Topics) == 0 {
		add("Topics is empty")
	}
	seen := make(map[string]bool, len(c.Topics))
	for i, t := range c.Topics {
		switch {
		case t == "":
			add("Topics[%d] is empty", i)
		case len(t) > maxTopicLen:
			add("Topics[%d] is %d bytes, the limit is %d", i, len(t), maxTopicLen)
		case !nameRE.MatchString(t):
			add("Topics[%d] %q: want letters, digits, '_', '-', '%%' or '|'", i, t)
		case seen[t]:
			add("Topics[%d] %q is listed twice", i, t)
		}
		seen[t] = true
	}
	if len(c.RetryDelays) > 32 {
		add("RetryDelays has %d delays, at most 32", len(c.RetryDelays))
	}
	seenDelay := make(map[time.Duration]bool, len(c.RetryDelays))
	for i, d := range c.RetryDelays {
		switch {
		case d <= 0 || d%time.Millisecond != 0 || d > maxRetryDelay:
			add("RetryDelays[%d] is %v, want a positive number of whole milliseconds, at most %v (the broker's timerMaxDelaySec)", i, d, maxRetryDelay)
		case seenDelay[d]:
			add("RetryDelays[%d] %v is listed twice", i, d)
		}
		seenDelay[d] = true
	}
	if len(c.RetryDelays) > 0 {
		for i, t := range c.Topics {
			if rt := RetryTopic(t); len(rt) > maxTopicLen {
				add("Topics[%d]: retry topic %q is longer than %d bytes", i, rt, maxTopicLen)
			} else if seen[rt] {
				add("Topics lists %q, the retry topic of %q: list the topics, not their retry topics", rt, t)
			}
		}
	}
	if c.StartFrom > LastOffset {
		add("StartFrom is %d, not a known start", c.StartFrom)
	}
	if c.BatchMaxSize < 0 || c.BatchMaxSize > 1024 {
		add("BatchMaxSize is %d, want 1..1024 (0 for the default)", c.BatchMaxSize)
	}
	if c.DeadLetter == DeadLetterBroker && c.BatchMaxSize > 1 {
		add("BatchMaxSize is %d, but DeadLetterBroker needs 1: the broker's DLQ move covers every message of a consume call", c.BatchMaxSize)
	}
	if c.PullBatchSize < 0 || c.PullBatchSize > 1024 {
		add("PullBatchSize is %d, want 1..1024 (0 for the default 32)", c.PullBatchSize)
	}
	if c.ConsumeGoroutines < 0 || c.ConsumeGoroutines > 100000 {
		add("ConsumeGoroutines is %d, want 1..100000 (0 for the default 64)", c.ConsumeGoroutines)
	}
	if c.MaxReconsumeTimes < 0 || c.MaxReconsumeTimes > 10000 {
		add("MaxReconsumeTimes is %d, want 1..10000 (0 for the default 16)", c.MaxReconsumeTimes)
	}
	if c.RetryDelayLevel < 0 || c.RetryDelayLevel > 18 {
		add("RetryDelayLevel is %d, want 1..18 (0 for the broker's schedule)", c.RetryDelayLevel)
	}
	if c.SuspendTime < 0 || c.ConsumeTimeout < 0 || c.DeadLetterTimeout < 0 || c.CloseTimeout < 0 {
		add("SuspendTime, ConsumeTimeout, DeadLetterTimeout and CloseTimeout must not be negative")
	}
	if c.SuspendTime > 30*time.Second {
		add("SuspendTime is %v, want at most 30s: the client sleeps it out even during shutdown", c.SuspendTime)
	}
	switch c.DeadLetter {
	case DeadLetterTopic:
		if t := c.DeadLetterTopic; t != "" && (len(t) > maxTopicLen || !nameRE.MatchString(t)) {
			add("DeadLetterTopic %q: want letters, digits, '_', '-', '%%' or '|', at most %d bytes", t, maxTopicLen)
		}
	case DeadLetterBroker:
		if c.DeadLetterTopic != "" {
			add("DeadLetterTopic is set, but DeadLetter is DeadLetterBroker (the broker's %%DLQ%%%s)", c.Group)
		}
	default:
		add("DeadLetter is %d, not a known mode", c.DeadLetter)
	}
	if c.DeadLetterMaxBytes < 0 {
		add("DeadLetterMaxBytes is negative (%d)", c.DeadLetterMaxBytes)
	}
	if (c.AccessKey == "") != (c.SecretKey == "") {
		add("AccessKey and SecretKey must be set together")
	}
	if c.InstanceName != "" && !nameRE.MatchString(c.InstanceName) {
		add("InstanceName %q: want letters, digits, '_', '-', '%%' or '|'", c.InstanceName)
	}
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	if c.Tags == "" {
		c.Tags = "*"
	}
	if c.BatchMaxSize == 0 {
		c.BatchMaxSize = 32
		if c.DeadLetter == DeadLetterBroker {
			c.BatchMaxSize = 1
		}
	}
	if c.PullBatchSize == 0 {
		c.PullBatchSize = 32
	}
	if c.ConsumeGoroutines == 0 {
		c.ConsumeGoroutines = 64
	}
	if c.MaxReconsumeTimes == 0 {
		c.MaxReconsumeTimes = 16
	}
	if c.SuspendTime == 0 {
		c.SuspendTime = time.Second
	}
	if c.ConsumeTimeout == 0 {
		c.ConsumeTimeout = 15 * time.Minute
	}
	if c.DeadLetterTimeout == 0 {
		c.DeadLetterTimeout = 10 * time.Second
	}
	if c.DeadLetterMaxBytes == 0 {
		c.DeadLetterMaxBytes = 4<<20 - 64<<10
	}
	if c.InstanceName == "" {
		c.InstanceName = fmt.Sprintf("idem-%d-%d", os.Getpid(), instances.Add(1))
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 10 * time.Second
	}
	if c.RouteWait == 0 {
		c.RouteWait = time.Minute
	}
	if c.GroupCheck == 0 {
		c.GroupCheck = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}
