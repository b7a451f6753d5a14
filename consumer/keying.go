package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

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
	m.dedupKey = it.claim.Key
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
			if it.lineage = m.hasOrigin; it.lineage {
				fp, err := c.cfg.Fingerprint(m)
				if err != nil {
					return fmt.Errorf("fingerprint: %w", err)
				}
				it.claim.Fingerprint = fp
			}
			return nil
		}
	}
	id, err := c.cfg.Key(m)
	if err != nil && errors.Is(err, ErrNoKey) && c.cfg.OnMissingKey == FallBackToMessageID && m.identity() != "" {
		if !refused {
			c.stats.keyFallbacks.Add(1)
			c.cfg.Logger.Warn("idem: no key, keyed by the message ID (OnMissingKey)", slog.String("message", m.Ref()), slog.Any("error", err))
		}
		id, err = m.identity(), nil
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
