package observe

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem/dedup"
)

// JournalReader is what WatchJournal reads of an effect journal:
// dedup.Journal's CountSteps and Steps (*pgstore.Store,
// *sqlitestore.Store, *mysqlstore.Store).
type JournalReader interface {
	CountSteps(ctx context.Context) (byState map[dedup.StepState]int64, expiredPending int64, err error)
	Steps(ctx context.Context, f dedup.StepFilter) ([]dedup.StepRecord, error)
}

// Attributes of the journal's gauges.
const (
	// AttrJournal names a watched journal, as WatchJournal was given it.
	AttrJournal = attribute.Key("idem_journal")
	// AttrStepState is a step's state: pending, succeeded, failed,
	// unknown or in_doubt (dedup.StepState's String).
	AttrStepState = attribute.Key("state")
)

// scopeName is the instrumentation scope of the gauges observe defines
// itself.
const scopeName = "github.com/idemkit/idem/observe"

// watchedJournal is one effect journal whose gauges /metrics serves.
type watchedJournal struct {
	name string
	reg  metric.Registration
}

// WatchJournal adds the gauges of an effect journal (dedup.Journal, the
// store package effect records its steps in) to /metrics under name, read
// from the store at every scrape with CountSteps:
//
//   - idem_effect_steps{state}: the steps by the state the journal
//     holds, every state listed (0 without any): pending (a pending
//     step whose holder's lease ran out too), succeeded, failed, unknown,
//     in_doubt;
//   - idem_effect_steps_unresolved: the steps whose outcome nobody knows
//     and no holder is finding out: unknown, in_doubt, and pending past
//     the holder's lease — what `idem effects` lists;
//   - idem_effect_steps_unresolved_oldest_age_seconds: the time since the
//     first attempt of the oldest of them (0 without any): a provider
//     keeps a request's key for a limited time from about then.
//
// A step is unknown briefly as a matter of course (its message's next
// delivery reads it back); one in doubt waits for an operator (`idem
// effects resolve`). Every instance watching the same table reports the
// same counts: aggregate them with max, not sum.
func (s *Server) WatchJournal(name string, j JournalReader) error {
	if j == nil {
		return errors.New("observe: WatchJournal of a nil journal")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("observe: WatchJournal after Close")
	}
	for _, w := range s.journals {
		if w.name == name {
			return fmt.Errorf("observe: a journal named %q is watched already", name)
		}
	}
	m := s.mp.Meter(scopeName)
	steps, err := m.Int64ObservableGauge("idem.effect.steps", metric.WithUnit("{step}"),
		metric.WithDescription("Effect journal steps by state (pending counts those past their holder's lease too)."))
	if err != nil {
		return err
	}
	unresolved, err := m.Int64ObservableGauge("idem.effect.steps.unresolved", metric.WithUnit("{step}"),
		metric.WithDescription("Effect journal steps whose outcome is unknown and that no holder is finding out: unknown, in_doubt, and pending past the holder's lease."))
	if err != nil {
		return err
	}
	oldest, err := m.Float64ObservableGauge("idem.effect.steps.unresolved.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Seconds since the first attempt of the oldest unresolved effect journal step; 0 when none is unresolved."))
	if err != nil {
		return err
	}
	journal := AttrJournal.String(name)
	reg, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		byState, expired, err := j.CountSteps(ctx)
		if err != nil {
			return fmt.Errorf("observe: journal %q: %w", name, err)
		}
		for st := dedup.StepPending; st <= dedup.StepInDoubt; st++ {
			n := byState[st]
			if st == dedup.StepPending {
				n += expired
			}
			o.ObserveInt64(steps, n, metric.WithAttributes(journal, AttrStepState.String(st.String())))
		}
		n := byState[dedup.StepUnknown] + byState[dedup.StepInDoubt] + expired
		o.ObserveInt64(unresolved, n, metric.WithAttributes(journal))
		age := 0.0
		if n > 0 {
			recs, err := j.Steps(ctx, dedup.StepFilter{Limit: 1}) // the oldest first attempt first
			if err != nil {
				return fmt.Errorf("observe: journal %q: %w", name, err)
			}
			if len(recs) > 0 {
				age = recs[0].SinceFirstAttempt.Seconds()
			}
		}
		o.ObserveFloat64(oldest, age, metric.WithAttributes(journal))
		return nil
	}, steps, unresolved, oldest)
	if err != nil {
		return err
	}
	s.journals = append(s.journals, watchedJournal{name: name, reg: reg})
	return nil
}
