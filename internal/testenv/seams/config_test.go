package seams_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
)

// config is one consumer configuration of the Kafka mode (kafka_test.go),
// drawn from the seed: every setting that changes which messages are
// applied is one of its dimensions. Rule (docs/development.md): a new
// setting of that kind lands with its dimension here.
//
// Not drawn yet, and why:
//   - the form-field key (consumer.ByFormField): the payments are JSON; a
//     second payload encoding is still to be added to the handler;
//   - the SQLite and MySQL stores: the runner's handler and business table
//     are Postgres's (pgx.Tx); a store of another transaction type needs a
//     handler of its own;
//   - RocketMQ: the Kafka mode drives kafka.Source only.
type config struct {
	// key: "msgid" (ByMessageID), "record" (ByRecordKey), "header"
	// (ByHeader(idemKeyHeader)), "json" (ByJSONField("pay")), "composite"
	// (the JSON field and an Optional header the producer never sets), or
	// "" (Config.Offsets alone).
	key string
	// tenant: "" (none), "header" (the platform's header, one tenant per
	// payment), "topic" (the topic the message is read from).
	tenant   string
	offsets  bool // Config.Offsets (pgstore)
	startAt  bool // kafka.Config.StartOffsets from the store, beside offsets
	keyLanes int
	batch    int // Config.BatchSize
	// nonBlocking: Retries is NonBlocking with delays, attempts, keyOrdered
	// (drawn here for a third of the seeds, and by the parking dimension
	// for a further third: parking_test.go); else Blocking.
	nonBlocking bool
	delays      []time.Duration
	attempts    int
	keyOrdered  bool
	// readDelays are the Source's RetryDelays: every delay ever configured,
	// so that a copy written to a retry topic of a delay since removed is
	// still read (a user removing a delay keeps its topic read until it
	// drained).
	readDelays []time.Duration
	startFrom  kafka.StartFrom
	// store: "pg" or "pg-partitioned" (pgstore.Config.PartitionWidth).
	store string
	redis bool // the Redis front over the store
	// step: the handler's call to a payment provider (step_test.go).
	step stepConfig
	// entity: Config.Entity and Config.Stale (entity_test.go).
	entity entityConfig
	// park: KeyOrdered's parking, durable or in memory, and its limits
	// (parking_test.go).
	park parkConfig
}

const (
	idemKeyHeader = "Idempotency-Key"
	tenantHeader  = "x-tenant"
	statusHeader  = "x-status" // the composite key's optional part: never set
)

// retryDelayPool are the delays a configuration draws from; their retry
// topics exist from the start, so that a restart may add one.
var retryDelayPool = []time.Duration{50 * time.Millisecond, 300 * time.Millisecond, time.Second}

// drawConfig draws a configuration the consumer accepts.
func drawConfig(rng *rand.Rand) config {
	c := config{
		key:       []string{"msgid", "record", "header", "json", "composite", ""}[rng.IntN(6)],
		tenant:    []string{"", "header", "topic"}[rng.IntN(3)],
		batch:     []int{1, 8, 100}[rng.IntN(3)],
		startFrom: kafka.StartFrom(rng.IntN(2)),
		store:     []string{"pg", "pg-partitioned"}[rng.IntN(2)],
	}
	c.offsets = c.key == "" || rng.IntN(3) == 0
	c.startAt = c.offsets && rng.IntN(2) == 0
	c.redis = !c.offsets && c.store == "pg" && c.key != "" && rng.IntN(4) == 0
	if !c.offsets && rng.IntN(3) == 0 {
		c.keyLanes = 2 + rng.IntN(3)
	}
	if c.key != "" && rng.IntN(3) > 0 {
		c.nonBlocking = true
		c.attempts = 1 + rng.IntN(2)
		c.keyOrdered = rng.IntN(3) == 0
		for _, d := range retryDelayPool {
			if len(c.delays) == 0 || rng.IntN(2) == 0 {
				c.delays = append(c.delays, d)
			}
		}
		rng.Shuffle(len(c.delays), func(i, j int) { c.delays[i], c.delays[j] = c.delays[j], c.delays[i] })
	}
	c.readDelays = slices.Clone(c.delays)
	return c
}

// change is a change of configuration a user makes between two runs: a
// delay added or removed, Blocking ↔ NonBlocking, KeyLanes changed. It
// returns the new configuration and what changed ("" for nothing: the
// change drawn does not apply to c).
func (c config) change(rng *rand.Rand) (config, string) {
	n := c
	n.delays = slices.Clone(c.delays)
	n.readDelays = slices.Clone(c.readDelays)
	switch rng.IntN(4) {
	case 0: // Blocking ↔ NonBlocking
		if c.key == "" {
			return c, "" // New refuses NonBlocking with Offsets alone
		}
		n.nonBlocking = !c.nonBlocking
		if n.nonBlocking {
			n.attempts = max(1, c.attempts)
			if len(n.delays) == 0 {
				n.delays = []time.Duration{retryDelayPool[rng.IntN(len(retryDelayPool))]}
			}
			n.readDelays = union(n.readDelays, n.delays)
			return n, "Blocking → NonBlocking " + delayList(n.delays)
		}
		return n, "NonBlocking → Blocking"
	case 1: // a delay added
		if !c.nonBlocking {
			return c, ""
		}
		var free []time.Duration
		for _, d := range retryDelayPool {
			if !slices.Contains(c.delays, d) {
				free = append(free, d)
			}
		}
		if len(free) == 0 {
			return c, ""
		}
		d := free[rng.IntN(len(free))]
		n.delays = append(n.delays, d)
		n.readDelays = union(n.readDelays, n.delays)
		return n, "delay " + wire.RetryDelayName(d) + " added"
	case 2: // a delay removed (its topic still read)
		if !c.nonBlocking || len(c.delays) < 2 {
			return c, ""
		}
		i := rng.IntN(len(c.delays))
		d := c.delays[i]
		n.delays = slices.Delete(n.delays, i, i+1)
		return n, "delay " + wire.RetryDelayName(d) + " removed"
	default: // KeyLanes changed
		if c.offsets {
			return c, "" // New refuses KeyLanes with Offsets
		}
		for n.keyLanes == c.keyLanes {
			n.keyLanes = []int{0, 2, 4}[rng.IntN(3)]
		}
		return n, fmt.Sprintf("KeyLanes %d → %d", c.keyLanes, n.keyLanes)
	}
}

func union(a, b []time.Duration) []time.Duration {
	out := slices.Clone(a)
	for _, d := range b {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

func delayList(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, wire.RetryDelayName(d))
	}
	return "[" + strings.Join(s, " ") + "]"
}

// business reports whether the key is the payment: a re-sent payment is a
// duplicate, not a new one.
func (c config) business() bool { return c.key != "" && c.key != "msgid" }

// String is the configuration as a failure prints it.
func (c config) String() string {
	var b strings.Builder
	key := c.key
	if key == "" {
		key = "none"
	}
	fmt.Fprintf(&b, "key=%s", key)
	if c.tenant != "" {
		fmt.Fprintf(&b, " tenant=%s", c.tenant)
	}
	if c.offsets {
		b.WriteString(" offsets")
		if c.startAt {
			b.WriteString("+StartOffsets")
		}
	}
	if c.keyLanes > 1 {
		fmt.Fprintf(&b, " keylanes=%d", c.keyLanes)
	}
	fmt.Fprintf(&b, " batch=%d", c.batch)
	if c.nonBlocking {
		fmt.Fprintf(&b, " retries=NonBlocking%s attempts=%d", delayList(c.delays), c.attempts)
		if c.keyOrdered {
			b.WriteString(" keyordered")
		}
	} else {
		b.WriteString(" retries=Blocking")
	}
	if len(c.readDelays) > len(c.delays) {
		fmt.Fprintf(&b, " reads=%s", delayList(c.readDelays))
	}
	if c.startFrom == kafka.LastOffset {
		b.WriteString(" start=LastOffset")
	} else {
		b.WriteString(" start=FirstOffset")
	}
	fmt.Fprintf(&b, " store=%s", c.store)
	if c.redis {
		b.WriteString("+redis")
	}
	b.WriteString(c.step.String())
	b.WriteString(c.entity.String())
	b.WriteString(c.park.String())
	return b.String()
}

// keyFunc is the configuration's Key (nil: none).
func (c config) keyFunc() consumer.KeyFunc {
	switch c.key {
	case "msgid":
		return consumer.ByMessageID()
	case "record":
		return consumer.ByRecordKey()
	case "header":
		return consumer.ByHeader(idemKeyHeader)
	case "json":
		return consumer.ByJSONField("pay")
	case "composite":
		return consumer.Composite(consumer.ByJSONField("pay"), consumer.ByHeader(statusHeader).Optional())
	}
	return nil
}

// tenantFunc is the configuration's Tenant (nil: none).
func (c config) tenantFunc() consumer.KeyFunc {
	switch c.tenant {
	case "header":
		return consumer.ByHeader(tenantHeader)
	case "topic":
		return func(m *consumer.Message) (string, error) { return m.Topic, nil }
	}
	return nil
}
