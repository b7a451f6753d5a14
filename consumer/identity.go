package consumer

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem/consumer/internal/envelope"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// keyItem derives the item's dedup key and fingerprint. An error means the
// message is dead-lettered with it, for the cause returned: CauseValidate
// when Config.Validate refused it, else CauseBadInput. it.claim then holds
// what could be derived — a refused message's key too, for its letter; it
// is never claimed. A zero cause with an error means the message was not
// settled: ctx ended while Validate's check was being waited for.
//
// flush settles the items ahead of this one; keyItem calls it before it
// waits, so that they are not held up by it.
func (c *Consumer[TTx]) keyItem(ctx context.Context, l *lane[TTx], it *item, flush func() error) (Cause, error) {
	m := it.msg
	c.readOrigin(m) // first: a dead letter of a copy keeps its original's coordinates
	if max := c.cfg.MaxPayloadBytes; max > 0 && len(m.Value) > max {
		return CauseBadInput, fmt.Errorf("%w: %d bytes, the limit is %d", ErrPayloadTooLarge, len(m.Value), max)
	}
	if c.cfg.Validate != nil {
		refused, err := c.validate(ctx, l, m, flush)
		if err != nil {
			return 0, err
		}
		if refused != nil {
			// The key names, in the letter, the message a forgery imitates;
			// it is not claimed, so the genuine one is judged on its own.
			_ = c.deriveKey(it, true)
			return CauseValidate, fmt.Errorf("validate: %w", refused)
		}
	}
	if err := c.deriveKey(it, false); err != nil {
		return CauseBadInput, err
	}
	if err := c.deriveEntity(it); err != nil {
		return CauseBadInput, err
	}
	if err := c.pastRetention(it); err != nil {
		return CauseExhausted, err
	}
	envelope.SetIdentity(m, it.claim.Key, it.claim.Fingerprint)
	return 0, nil
}

// validate runs Config.Validate on m and returns what it refused m with
// (nil: m passed). A Retryable error is waited out on the unbounded policy,
// outside m's retry budget, after flush settled the items ahead; err is
// set only when ctx ends meanwhile, or flush fails.
func (c *Consumer[TTx]) validate(ctx context.Context, l *lane[TTx], m *Message, flush func() error) (refused, err error) {
	verr := c.cfg.Validate(ctx, m)
	if verr == nil || !IsRetryable(verr) {
		return verr, nil
	}
	if err := flush(); err != nil {
		return nil, err
	}
	first := true
	err = c.untilDone(ctx, l, "validate", func() error {
		if first {
			first = false
			return verr // the failure that brought us here: wait before the next call
		}
		return c.cfg.Validate(ctx, m)
	}, func(err error) (error, bool) {
		if IsRetryable(err) {
			return nil, false
		}
		refused = err
		return nil, true
	})
	if err != nil {
		return nil, err
	}
	return refused, nil
}

// deriveKey sets it.claim: the key (as soon as it is known, so that a
// letter carries it when the fingerprint fails), the fingerprint and the
// source. refused: the message is dead-lettered whatever comes of it, so a
// fallback to the message ID is neither counted nor logged.
//
// It is the one place a message's identity is decided. A message is
// keyed, and fingerprinted, at its first delivery; every copy of it —
// retry copy, dead letter, redriven letter — carries the result
// (wire.MetaKeyScope, wire.MetaKey, wire.MetaFingerprint: wire.Letter.Record), and a copy
// whose lineage the consumer honours (Message.Origin) is keyed from what
// it carries (carriedIdentity), never again from its own topic or
// headers as delivered: a retry copy arrives on a retry topic, and a
// tenant taken from the topic would put it in another scope, where its
// applied original would not stop it. A copy that carries no identity (a
// copy written by an older version) is keyed from its original's view
// (originalView): Key, Tenant and Fingerprint see the original's topic,
// partition, offset and message ID, never the copy's.
func (c *Consumer[TTx]) deriveKey(it *item, refused bool) error {
	m := it.msg
	src := m.Ref()
	if c.cfg.Offsets != nil {
		if m.Topic == "" || m.Offset < 0 {
			return fmt.Errorf("%w: with Config.Offsets a message needs a topic and an offset (got %q, %d)", ErrNoKey, m.Topic, m.Offset)
		}
		if c.cfg.Key == nil {
			// No key row: the key names the message, for dead letters,
			// observers and Message.DedupKey (the work flowing on from it).
			// A redriven copy is named by its original and claimed under
			// that name: its offset is new, the message is not.
			id := m.ID
			if id == "" {
				id = m.Coordinates()
			}
			if o, ok := m.Origin(); ok {
				if id = o.ID; id == "" {
					id = o.Coordinates()
				}
			}
			k := dedup.Key{Scope: c.cfg.Name, ID: id}
			if err := k.Validate(); err != nil {
				return err
			}
			it.claim = dedup.Claim{Key: k, Source: src}
			if _, it.lineage = m.Origin(); it.lineage {
				fp, err := c.cfg.Fingerprint(originalView(m))
				if err != nil {
					return fmt.Errorf("fingerprint: %w", err)
				}
				it.claim.Fingerprint = fp
			}
			return nil
		}
	}
	if k, fp, ok := c.carriedIdentity(m); ok {
		it.claim = dedup.Claim{Key: k, Fingerprint: fp, Source: src}
		if fp == (dedup.Fingerprint{}) {
			var err error
			if it.claim.Fingerprint, err = c.cfg.Fingerprint(originalView(m)); err != nil {
				return fmt.Errorf("fingerprint: %w", err)
			}
		}
		return nil
	}
	m = originalView(m) // what Key, Tenant and Fingerprint see: the original, never a copy's topic
	id, err := c.cfg.Key(m)
	if err != nil && errors.Is(err, ErrNoKey) && c.cfg.OnMissingKey == FallBackToMessageID && identity(m) != "" {
		if !refused {
			c.stats.keyFallbacks.Add(1)
			c.cfg.Logger.Warn("idem: no key, keyed by the message ID (OnMissingKey)", slog.String("message", m.Ref()), slog.Any("error", err))
		}
		id, err = identity(m), nil
	}
	if !refused {
		c.checkKey(m, err)
	}
	if err != nil {
		return fmt.Errorf("key: %w", err)
	}
	scope := c.cfg.Name
	if c.cfg.Tenant != nil {
		t, err := c.cfg.Tenant(m)
		if err != nil {
			return fmt.Errorf("tenant: %w", err)
		}
		scope += "/" + t
	}
	k := dedup.Key{Scope: scope, ID: id}
	if err := k.Validate(); err != nil {
		return err
	}
	it.claim = dedup.Claim{Key: k, Source: src}
	fp, err := c.cfg.Fingerprint(m)
	if err != nil {
		return fmt.Errorf("fingerprint: %w", err)
	}
	it.claim.Fingerprint = fp
	return nil
}

// carriedIdentity returns the key, and the fingerprint when it carries
// one, that m carries from its first delivery (wire.MetaKeyScope, wire.MetaKey,
// wire.MetaFingerprint); ok is false when m is not a copy whose lineage the
// consumer honours, carries no identity, or carries one the consumer
// refuses (logged): m is then keyed from its original's view.
//
// Headers are the producer's to write: a carried identity counts only
// with honoured lineage, and its scope must be this consumer's — its Name,
// or Name + "/" + a tenant when Config.Tenant is set. A retry copy lies on
// a retry topic only the consumer writes to (source.Description.RetryOf), so its tenant
// is taken as carried. A redriven copy lies on its original's own topic,
// which anyone who can produce there can write: its carried tenant must be
// the one Config.Tenant derives from it, and its carried key the one
// Config.Key derives from its original's view, so that a forged copy can
// neither write into another tenant's scope nor take another message's key.
func (c *Consumer[TTx]) carriedIdentity(m *Message) (dedup.Key, dedup.Fingerprint, bool) {
	origin, ok := m.Origin()
	if !ok {
		return dedup.Key{}, dedup.Fingerprint{}, false
	}
	scope, ok := m.Header(wire.MetaKeyScope)
	id, ok2 := m.Header(wire.MetaKey)
	if !ok || !ok2 {
		return dedup.Key{}, dedup.Fingerprint{}, false
	}
	k := dedup.Key{Scope: string(scope), ID: string(id)}
	refuse := func(why string) (dedup.Key, dedup.Fingerprint, bool) {
		c.cfg.Logger.Warn("idem: the identity a copy carries is not honoured; it is keyed from its original's view",
			slog.String("message", m.Ref()), slog.String("scope", k.Scope), slog.String("why", why))
		return dedup.Key{}, dedup.Fingerprint{}, false
	}
	if err := k.Validate(); err != nil {
		return refuse(err.Error())
	}
	tenant, hasTenant := strings.CutPrefix(k.Scope, c.cfg.Name+"/")
	switch {
	case c.cfg.Tenant == nil && k.Scope != c.cfg.Name:
		return refuse("the scope is not the consumer's Name " + strconv.Quote(c.cfg.Name))
	case c.cfg.Tenant != nil && (!hasTenant || tenant == ""):
		return refuse("the scope is not the consumer's Name and a tenant (" + strconv.Quote(c.cfg.Name+"/<tenant>") + ")")
	case c.cfg.Tenant != nil && !origin.Retry:
		t, err := c.cfg.Tenant(originalView(m))
		if err != nil {
			return refuse("tenant: " + err.Error())
		}
		if t != tenant {
			return refuse("a redriven copy's tenant must be the one Tenant derives from it, " + strconv.Quote(t))
		}
	}
	if !origin.Retry {
		// Its lineage names its original, not its key: the key the Key
		// function gives the original's view must be the one it carries,
		// so that a forged copy cannot claim the key of another message
		// (under ByMessageID on Kafka, a later, unseen position).
		v := originalView(m)
		want, err := c.cfg.Key(v)
		if err != nil && errors.Is(err, ErrNoKey) && c.cfg.OnMissingKey == FallBackToMessageID && identity(v) != "" {
			want, err = identity(v), nil
		}
		if err != nil {
			return refuse("key: " + err.Error())
		}
		if want != k.ID {
			return refuse("a redriven copy's key must be the one Key derives from its original, " + strconv.Quote(want))
		}
	}
	var fp dedup.Fingerprint
	if v, ok := m.Header(wire.MetaFingerprint); ok {
		if n, err := hex.Decode(fp[:], v); err != nil || n != len(fp) {
			return refuse(wire.MetaFingerprint + " is not a hex SHA-256")
		}
	}
	return k, fp, true
}

// originalView returns m as its original was delivered, for Key, Tenant
// and Fingerprint: for a copy whose lineage the consumer honours, m with
// its original's topic, partition, offset and message ID and without the
// metadata idem wrote on the copy (dead-letter, retry and redrive
// headers); else m itself.
func originalView(m *Message) *Message {
	o, ok := m.Origin()
	if !ok {
		return m
	}
	v := *m
	v.Topic, v.Partition, v.Offset, v.ID = o.Topic, o.Partition, o.Offset, o.ID
	v.Headers = make([]Header, 0, len(m.Headers))
	for _, h := range m.Headers {
		if !wire.IsMeta(h.Key) && h.Key != wire.MetaRedriveCount && h.Key != wire.MetaRedrivenFrom {
			v.Headers = append(v.Headers, h)
		}
	}
	return &v
}

// keyCheckRun is how many of a consumer's first messages keyed by
// Config.Key judge the key function: more than half of them failing is a
// configuration error (ErrKeyMisconfigured), not bad messages.
const keyCheckRun = 20

// keyCheck counts Config.Key's failures over the first keyCheckRun
// messages it keys; safe for concurrent use.
type keyCheck struct {
	finished atomic.Bool // judged: every later message passes by without the lock
	mu       sync.Mutex
	seen     int
	failed   int
	verdict  error // ErrKeyMisconfigured, once judged so
}

// checkKey counts the outcome of Config.Key on m (err nil: a key) while
// the first messages are judged. Once more than half of keyCheckRun have
// failed, the key function is taken to be misconfigured: Health shows it,
// and one ERROR line says so. Each message is still dead-lettered.
func (c *Consumer[TTx]) checkKey(m *Message, err error) {
	k := &c.keyCheck
	if k.finished.Load() {
		return
	}
	k.mu.Lock()
	if k.finished.Load() {
		k.mu.Unlock()
		return
	}
	k.seen++
	if err != nil {
		k.failed++
	}
	var verdict error
	if k.failed > keyCheckRun/2 {
		k.finished.Store(true)
		verdict = fmt.Errorf("%w: Config.Key failed on %d of the first %d messages (last %s: %v); check the key path or header against the messages the producers send",
			ErrKeyMisconfigured, k.failed, k.seen, m.Ref(), err)
		k.verdict = verdict
	} else if k.seen >= keyCheckRun {
		k.finished.Store(true)
	}
	failed, seen := k.failed, k.seen
	k.mu.Unlock()
	if verdict != nil {
		c.cfg.Logger.Error("idem: the key function looks misconfigured; its messages are dead-lettered",
			slog.Int("failed", failed), slog.Int("of", seen), slog.String("message", m.Ref()), slog.Any("error", err))
	}
}

// keyVerdict is the key check's ErrKeyMisconfigured, or nil.
func (c *Consumer[TTx]) keyVerdict() error {
	c.keyCheck.mu.Lock()
	defer c.keyCheck.mu.Unlock()
	return c.keyCheck.verdict
}
