package consumer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"github.com/idemkit/idem/internal/shorten"
	"strconv"
	"strings"
	"unicode"

	"github.com/idemkit/idem/dedup"
)

// Letter is a message the consumer could not process, with why.
type Letter struct {
	Message *Message
	// Key is the dedup key, zero when no key could be derived. A message
	// Validate refused carries the key it would have been claimed under
	// (the key is not claimed: see Config.Validate).
	Key dedup.Key
	// Fingerprint is the message's fingerprint under Key; zero when it was
	// not computed (no key, a fingerprint that failed).
	Fingerprint dedup.Fingerprint
	// Cause says, as one of a few values, why the message was
	// dead-lettered; Reason says it in words.
	Cause Cause
	// Reason says what went wrong; errors.Is works on it
	// (dedup.ErrFingerprintMismatch, dedup.ErrInvalidKey, ErrNoKey, ...).
	Reason error
	// Attempts is how many times the handler ran and failed (0 when it never
	// ran).
	Attempts int
	// Headers go on the letter in place of the message's headers of the
	// same names (matched case-insensitively; one with a nil Value only
	// removes them): a DeadLetterObserver's trace context, so that the
	// letter names the trace of the batch that failed it, not the
	// producer's. Record applies them; Message stays the message the
	// Source delivered.
	Headers []Header
}

// DeadLetter stores messages that cannot be processed. The consumer
// acknowledges a dead-lettered message only after DeadLetter returned nil, and
// retries a failing DeadLetter with backoff until it succeeds or the consumer
// stops: a message is never lost over a failing dead-letter sink. It may be
// called more than once for one message (at-least-once).
type DeadLetter interface {
	DeadLetter(ctx context.Context, l Letter) error
}

// DeadLetterFunc adapts a function to DeadLetter.
type DeadLetterFunc func(ctx context.Context, l Letter) error

func (f DeadLetterFunc) DeadLetter(ctx context.Context, l Letter) error { return f(ctx, l) }

// The metadata of a dead letter: the headers (Kafka) or user properties
// (RocketMQ) every adapter puts on the letters it writes, defined once. The
// original message's own headers come first, except earlier ones of these
// names, which are replaced. Other idem-* headers, such as the redrive
// lineage below and an outbox message's identity (idem-outbox-*), are the
// message's own and stay: a letter redriven later keeps the key it is
// deduplicated by.
const (
	MetaCause     = "idem-cause"              // why, as one value: Letter.Cause (bad_input, validate, rejected, fingerprint_mismatch, failed_before, permanent, exhausted)
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
	// A value larger than the adapter's dead-letter limit is left out, so
	// that an oversized message cannot block its partition; these say what
	// it was.
	MetaValueSHA256 = "idem-value-sha256" // hex
	MetaValueSize   = "idem-value-size"   // bytes, decimal
	// Lineage, set by `idem redrive` on a dead letter it sends back to its
	// topic, beside the Meta*Original* coordinates (and the message ID) it
	// copies from the letter. The consumer deduplicates a copy that carries
	// them by its original's identity (see Origin for when it does), and a
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
// honoured (Message.Origin), its original's: the letter names the message
// the copy stands for, and is redriven (and deduplicated) as that message
// again.
//
// The value is the original value, or nil when it is larger than maxValue
// bytes (then MetaValueSHA256 and MetaValueSize say what it was).
func (l Letter) Record(maxValue int) (headers []Header, value []byte) {
	m := l.Message
	headers = make([]Header, 0, len(m.Headers)+len(l.Headers)+14)
	for _, h := range m.Headers {
		if !isMeta(h.Key) && !replaced(h.Key, l.Headers) {
			headers = append(headers, h)
		}
	}
	for _, h := range l.Headers {
		if h.Value != nil && !isMeta(h.Key) {
			headers = append(headers, Header{Key: h.Key, Value: []byte(clean(string(h.Value)))})
		}
	}
	add := func(k, v string) { headers = append(headers, Header{Key: k, Value: []byte(clean(v))}) }
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
	MetaValueSHA256: true, MetaValueSize: true,
	MetaRetryAttempt: true, MetaRetryDue: true, MetaRetryFirstFailure: true, MetaRetryFollowing: true, MetaRetryDelay: true,
}

// isMeta reports whether a header is dead-letter metadata.
func isMeta(k string) bool { return metaNames[k] }

// replaced reports whether one of hs is named k (case-insensitively, as
// propagators' fields are).
func replaced(k string, hs []Header) bool {
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
