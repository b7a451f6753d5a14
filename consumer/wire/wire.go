package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/shorten"
)

// Letter is what a dead letter or a retry copy is made from: the message
// and why it left its lane. Its fields are consumer.Letter's, so that an
// adapter converts one: wire.Letter(l).Record(max).
type Letter struct {
	Message     *source.Message
	Key         dedup.Key
	Fingerprint dedup.Fingerprint
	Cause       Cause
	Reason      error
	Attempts    int
	// Headers go on the letter in place of the message's headers of the
	// same names (matched case-insensitively; one with a nil Value only
	// removes them): a dead-letter observer's trace context.
	Headers []source.Header
	// Entity is the entity the message is an event of, and the event's
	// version (MetaEntity, MetaEntityVersion); zero when it names none.
	Entity Entity
	// Watermark is, for a stale event (CauseStale), the entity's watermark
	// it met (MetaEntityWatermark); zero otherwise.
	Watermark dedup.Version
}

// Entity names the entity a message is an event of (a trade, a payment
// intent) and the event's version, which orders it among the entity's
// events (dedup.Watermarks). A zero Name: the message is of no entity.
type Entity struct {
	Name    string
	Version dedup.Version
}

// ParseVersion reads a version as Version.String writes it: "major.minor".
func ParseVersion(s string) (dedup.Version, error) {
	maj, min, ok := strings.Cut(s, ".")
	if !ok {
		return dedup.Version{}, fmt.Errorf("wire: version %q is not major.minor", s)
	}
	a, err1 := strconv.ParseInt(maj, 10, 64)
	b, err2 := strconv.ParseInt(min, 10, 64)
	if err1 != nil || err2 != nil {
		return dedup.Version{}, fmt.Errorf("wire: version %q is not major.minor", s)
	}
	return dedup.Version{Major: a, Minor: b}, nil
}

// Retry is what a retry copy carries beside its Letter (consumer.RetryLetter).
type Retry struct {
	Attempt      int           // the trip's number, from 1 (MetaRetryAttempt)
	Delay        time.Duration // the wait of its destination (MetaRetryDelay)
	Due          time.Time     // when the copy is to be processed (MetaRetryDue)
	FirstFailure time.Time     // when the message first went to retry (MetaRetryFirstFailure)
	Following    bool          // untried, it follows its key (MetaRetryFollowing)
}

// The metadata of a dead letter: the headers (Kafka) or user properties
// (RocketMQ) every adapter puts on the letters it writes, defined once. The
// original message's own headers come first, except earlier ones of these
// names, which are replaced. Other idem-* headers, such as the redrive
// lineage below and an outbox message's identity (idem-outbox-*), are the
// message's own and stay: a letter redriven later keeps the key it is
// deduplicated by.
const (
	MetaCause     = "idem-cause"              // why, as one value: Letter.Cause (bad_input, validate, rejected, fingerprint_mismatch, failed_before, permanent, exhausted, in_doubt, stale, parked_too_long)
	MetaReason    = "idem-reason"             // why, in words: the error text, at most dedup.MaxReasonLen bytes
	MetaAttempts  = "idem-attempts"           // failures charged to the message (Letter.Attempts), decimal
	MetaTopic     = "idem-original-topic"     // the message's topic
	MetaPartition = "idem-original-partition" // its Kafka partition or RocketMQ queue ID, decimal
	MetaLane      = "idem-original-lane"      // its lane: topic/partition, topic/broker/queueId
	MetaOffset    = "idem-original-offset"    // its offset in the partition or queue, decimal
	MetaMessageID = "idem-original-msg-id"    // its broker message ID (Message.ID)
	MetaAttempt   = "idem-original-attempt"   // the broker's delivery attempt (Message.Attempt)
	MetaKeyScope  = "idem-key-scope"          // the dedup key's scope; absent when no key was derived
	MetaKey       = "idem-key"                // the dedup key's ID; absent when no key was derived
	// the fingerprint under the key (hex SHA-256, Letter.Fingerprint);
	// absent when none was computed. With the cause and the key it tells
	// a re-send of one bad payload from another payload.
	MetaFingerprint = "idem-fingerprint"
	// The entity the message is an event of and the event's version
	// ("major.minor", dedup.Version.String), decided at its first delivery
	// (consumer.Config.Entity); absent when it names none. A retry copy and
	// a redriven letter are ordered by them, not by what the entity
	// function makes of the copy.
	MetaEntity        = "idem-entity"
	MetaEntityVersion = "idem-entity-version"
	// A stale event's letter (CauseStale): the entity's watermark it met.
	MetaEntityWatermark = "idem-entity-watermark"
	// A value larger than the adapter's dead-letter limit is left out, so
	// that an oversized message cannot block its partition; these say what
	// it was.
	MetaValueSHA256 = "idem-value-sha256" // hex
	MetaValueSize   = "idem-value-size"   // bytes, decimal
	// Lineage, set by `idem redrive` on a dead letter it sends back to its
	// topic, beside the Meta*Original* coordinates (and the message ID) it
	// copies from the letter. The consumer deduplicates a copy that carries
	// them by its original's identity (see source.Origin, and consumer's doc for when it does), and a
	// letter keeps them when the redriven message is dead-lettered again,
	// with the original's coordinates: another tool that sends letters back
	// must set MetaRedriveCount and keep the Meta*Original* headers.
	MetaRedriveCount = "idem-redrive-count" // how often the message was redriven, decimal
	MetaRedrivenFrom = "idem-redriven-from" // the dead letter it was redriven from: topic/partition/offset (Kafka), topic/broker/queue/offset (RocketMQ)
)

// Record lays l out for a broker: the headers and the value an adapter
// writes.
//
// The headers are the original message's (earlier dead-letter metadata
// left out, and those Letter.Headers replace; the redrive lineage and an
// outbox identity stay), then Letter.Headers, then the metadata above.
// Values carry no control characters (they become spaces), which some
// brokers' encodings cannot hold. The coordinates and message ID are the
// message's own, or, for a redriven copy whose lineage the consumer
// honoured (source.Message.Origin), its original's: the letter names the message
// the copy stands for, and is redriven (and deduplicated) as that message
// again.
//
// The value is the original value, or nil when it is larger than maxValue
// bytes (then MetaValueSHA256 and MetaValueSize say what it was).
func (l Letter) Record(maxValue int) (headers []source.Header, value []byte) {
	m := l.Message
	headers = make([]source.Header, 0, len(m.Headers)+len(l.Headers)+14)
	for _, h := range m.Headers {
		if !IsMeta(h.Key) && !replaced(h.Key, l.Headers) {
			headers = append(headers, h)
		}
	}
	for _, h := range l.Headers {
		if h.Value != nil && !IsMeta(h.Key) {
			headers = append(headers, source.Header{Key: h.Key, Value: []byte(clean(string(h.Value)))})
		}
	}
	add := func(k, v string) { headers = append(headers, source.Header{Key: k, Value: []byte(clean(v))}) }
	reason := "unknown"
	if l.Reason != nil {
		reason = l.Reason.Error()
	}
	add(MetaCause, l.Cause.String())
	add(MetaReason, shorten.Reason(reason))
	add(MetaAttempts, strconv.Itoa(l.Attempts))
	topic, partition, offset, id := m.Topic, m.Partition, m.Offset, m.ID
	if o, ok := m.Origin(); ok {
		topic, partition, offset, id = o.Topic, o.Partition, o.Offset, o.ID
	}
	add(MetaTopic, topic)
	add(MetaPartition, strconv.Itoa(int(partition)))
	add(MetaLane, m.Lane) // the lane the message was delivered on, which keeps a source's letters in order
	add(MetaOffset, strconv.FormatInt(offset, 10))
	add(MetaMessageID, id)
	add(MetaAttempt, strconv.Itoa(m.Attempt))
	if l.Key != (dedup.Key{}) {
		add(MetaKeyScope, l.Key.Scope)
		add(MetaKey, l.Key.ID)
		if l.Fingerprint != (dedup.Fingerprint{}) {
			add(MetaFingerprint, hex.EncodeToString(l.Fingerprint[:]))
		}
	}
	if l.Entity.Name != "" {
		add(MetaEntity, l.Entity.Name)
		add(MetaEntityVersion, l.Entity.Version.String())
		if l.Cause == CauseStale {
			add(MetaEntityWatermark, l.Watermark.String())
		}
	}
	value = m.Value
	if len(value) > maxValue {
		sum := sha256.Sum256(value)
		add(MetaValueSHA256, hex.EncodeToString(sum[:]))
		add(MetaValueSize, strconv.Itoa(len(value)))
		value = nil
	}
	return headers, value
}

var metaNames = map[string]bool{
	MetaCause: true, MetaFingerprint: true, MetaReason: true, MetaAttempts: true, MetaTopic: true, MetaPartition: true, MetaLane: true,
	MetaOffset: true, MetaMessageID: true, MetaAttempt: true, MetaKeyScope: true, MetaKey: true,
	MetaEntity: true, MetaEntityVersion: true, MetaEntityWatermark: true,
	MetaValueSHA256: true, MetaValueSize: true,
	MetaRetryAttempt: true, MetaRetryDue: true, MetaRetryFirstFailure: true, MetaRetryFollowing: true, MetaRetryDelay: true,
}

// IsMeta reports whether a header is dead-letter or retry metadata:
// one Record writes, and drops from the message it lays out.
func IsMeta(k string) bool { return metaNames[k] }

// replaced reports whether one of hs is named k (case-insensitively, as
// propagators' fields are).
func replaced(k string, hs []source.Header) bool {
	for _, h := range hs {
		if strings.EqualFold(h.Key, k) {
			return true
		}
	}
	return false
}

// clean replaces control characters with spaces.
func clean(s string) string {
	if strings.IndexFunc(s, unicode.IsControl) < 0 {
		return s
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// The headers of a retry copy, beside the lineage (MetaTopic, MetaPartition,
// MetaOffset, MetaMessageID, ...) Record writes. A dead letter
// leaves them out, so a redriven letter starts its retries afresh.
const (
	MetaRetryAttempt      = "idem-retry-attempt"       // the trip's number, from 1, decimal
	MetaRetryDue          = "idem-retry-due"           // when it is due, RFC 3339 with nanoseconds, UTC
	MetaRetryFirstFailure = "idem-retry-first-failure" // when it first went to retry, RFC 3339 with nanoseconds, UTC
	MetaRetryFollowing    = "idem-retry-following"     // "true": untried, it follows its key (consumer.NonBlocking.KeyOrdered)
	MetaRetryDelay        = "idem-retry-delay"         // the wait of its trip, as RetryDelayName: "10s", "1m", "1500ms"
)

// RetryDelayName names a retry delay in its largest whole unit (h, m, s,
// ms): "10s", "1m", "1500ms". It is the suffix of a Kafka retry topic
// (kafka.RetryTopic), the MetaRetryDelay header and the delay label of the
// retry metrics (otelconsumer); time.ParseDuration reads it back.
func RetryDelayName(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
}

// RetryRecord lays a retry copy out for a broker: Record (the whole value, never
// left out: a retry copy must carry its payload), then the retry headers.
// MetaLane is the original's lane on every trip (a dead letter's is the
// lane the message was delivered on), so that a copy names the original
// it stands for with its broker (KeyOrdered's holds); for a redriven
// copy, whose original's lane is not known, topic/partition, the lane its
// key was held under (source.Origin.HeldLane).
func (l Letter) RetryRecord(r Retry) (headers []source.Header, value []byte) {
	headers, value = l.Record(math.MaxInt)
	if o, ok := l.Message.Origin(); ok {
		for i := range headers {
			if headers[i].Key == MetaLane {
				headers[i].Value = []byte(clean(o.HeldLane()))
			}
		}
	}
	add := func(k, v string) { headers = append(headers, source.Header{Key: k, Value: []byte(v)}) }
	add(MetaRetryAttempt, strconv.Itoa(r.Attempt))
	add(MetaRetryDue, r.Due.UTC().Format(time.RFC3339Nano))
	add(MetaRetryFirstFailure, r.FirstFailure.UTC().Format(time.RFC3339Nano))
	add(MetaRetryDelay, RetryDelayName(r.Delay))
	if r.Following {
		add(MetaRetryFollowing, "true")
	}
	return headers, value
}

// RetryDue reads a retry copy's due time (MetaRetryDue); false when m
// carries none, or an unreadable one (deliver it at once).
func RetryDue(m *source.Message) (time.Time, bool) {
	v, ok := m.Header(MetaRetryDue)
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(v))
	return t, err == nil
}

// Cause says why a message was dead-lettered. A letter carries it in the
// MetaCause header as its String, so that whoever reads the dead-letter
// topic can tell incidents apart by it alone.
//
// One message, one incident: each cause but CauseFailedBefore is the first
// letter of its message's trouble. CauseFailedBefore is a repeat: another
// message with a key whose failure is recorded already (CausePermanent
// recorded it, and `idem failed` lists it), dead-lettered without running
// the handler — a re-send of what is dead-lettered already, counted apart.
type Cause uint8

const (
	CauseBadInput      Cause = iota + 1 // no key, an invalid key, an unreadable or too large payload: no row recorded
	CauseMismatch                       // its key was applied before with another payload
	CauseFailedBefore                   // its key was recorded as failed before: a repeat of an incident
	CausePermanent                      // Permanent, a constraint violation: recorded as failed
	CauseExhausted                      // its retries ran out
	CauseValidate                       // consumer.Config.Validate refused it: no row recorded, the key stays free
	CauseRejected                       // the handler refused it with Reject: rolled back, no row recorded, the key stays free
	CauseInDoubt                        // a call to a provider has an outcome that can no longer be found out or repeated safely (package effect): rolled back, no row recorded, the key stays free; or a stale event whose key has provider steps that did not fail (its stale record kept)
	CauseStale                          // an event at or below its entity's watermark (consumer.StaleDeadLetter): not applied; the store recorded it
	CauseParkedTooLong                  // its record key was parked (consumer.NonBlocking.KeyOrdered) longer or deeper than its limits: not tried, no row recorded, the key stays free
)

var causeNames = [...]string{
	CauseBadInput:      "bad_input",
	CauseMismatch:      "fingerprint_mismatch",
	CauseFailedBefore:  "failed_before",
	CausePermanent:     "permanent",
	CauseExhausted:     "exhausted",
	CauseValidate:      "validate",
	CauseRejected:      "rejected",
	CauseInDoubt:       "in_doubt",
	CauseStale:         "stale",
	CauseParkedTooLong: "parked_too_long",
}

func (c Cause) String() string {
	if int(c) < len(causeNames) && causeNames[c] != "" {
		return causeNames[c]
	}
	return "unknown"
}

// Causes lists every Cause, in their order.
func Causes() []Cause {
	return []Cause{CauseBadInput, CauseMismatch, CauseFailedBefore, CausePermanent, CauseExhausted, CauseValidate, CauseRejected, CauseInDoubt, CauseStale, CauseParkedTooLong}
}

// ParseCause returns the Cause whose String is s: what a reader of the
// dead-letter topic makes of a letter's MetaCause.
func ParseCause(s string) (Cause, bool) {
	for _, c := range Causes() {
		if c.String() == s {
			return c, true
		}
	}
	return 0, false
}

// Repeat reports whether the cause is a repeat of an incident dead-lettered
// before (CauseFailedBefore) rather than a new one.
func (c Cause) Repeat() bool { return c == CauseFailedBefore }
