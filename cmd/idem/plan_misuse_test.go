package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/redrive"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// gatedAdmin is a store's Admin whose second Find (Execute's check of a
// letter as it reads it for the send, after the recheck's) waits until
// the other execution's recheck looked the letter up: two operators
// confirming at once, both past the recheck before either sends.
type gatedAdmin struct {
	dedup.Admin
	finds         atomic.Int32
	rechecked     chan struct{} // closed at this execution's first Find
	otherRechecks chan struct{}
	once          sync.Once
}

func (a *gatedAdmin) Find(ctx context.Context, scope, id string) ([]dedup.Row, error) {
	if a.finds.Add(1) == 1 {
		a.once.Do(func() { close(a.rechecked) })
	} else {
		select { // a product that serializes executions never lets the other get here: go on
		case <-a.otherRechecks:
		case <-time.After(10 * time.Second):
		}
	}
	return a.Admin.Find(ctx, scope, id)
}

// TestRedrivePlanConfirmedTwiceAtOnce: one plan (one letter, its key
// released) confirmed by two operators at once — two `idem redrive --plan
// FILE` of one file, or two console dry runs of one plan confirmed
// together. Each Execute rechecks the plan against the group's offset,
// which neither has committed yet, and both send: the letter goes back
// twice. A plan executed twice must send once; the second must be stale
// or a no-op.
func TestRedrivePlanConfirmedTwiceAtOnce(t *testing.T) {
	p := newPayments(t)
	p.start()
	p.deadLetter("T02")
	p.fix("T02")
	ctx := context.Background()
	admin := pgtest.Store(t, p.pool, p.schema).Admin()
	broker := redrive.Kafka{Brokers: p.brokers}
	plan, err := redrive.Prepare(ctx, broker, redrive.Config{Admin: admin, Topic: p.dlq})
	if err != nil || len(plan.Entries) != 1 || plan.Entries[0].Verdict != redrive.VerdictSend {
		t.Fatalf("plan %+v, %v; want T02's letter sent", plan, err)
	}
	topicEnd := p.end(p.topic)
	a := &gatedAdmin{Admin: admin, rechecked: make(chan struct{})}
	b := &gatedAdmin{Admin: admin, rechecked: make(chan struct{})}
	a.otherRechecks, b.otherRechecks = b.rechecked, a.rechecked
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, ad := range []*gatedAdmin{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			shown := *plan
			shown.Entries = append([]redrive.Entry(nil), plan.Entries...)
			_, errs[i] = redrive.Execute(ctx, broker, ad, &shown)
		}()
	}
	wg.Wait()
	t.Logf("executions: %v; %v; finds %d, %d", errs[0], errs[1], a.finds.Load(), b.finds.Load())
	if end := p.end(p.topic); end != topicEnd+1 {
		t.Errorf("one plan confirmed twice at once sent %d copies of T02's letter, want 1 (errors %v, %v)", end-topicEnd, errs[0], errs[1])
	}
	p.waitFor("T02 applied", func(s consumer.Stats) bool { return s.Applied == 1 })
	if got := p.ledger(); got["T02"] != 1 {
		t.Errorf("ledger %v", got)
	}
}

// TestRedrivePlanFileEditedToSend: a plan file is the operator's to keep
// and give back, and a text file anyone can edit. T02's key is recorded
// failed and not released: the dry run says stop. The file is edited to
// verdict send with planned stop (the shape SkipLetter writes, with send
// for skip), its digest left out (readPlan checks one only when present).
// `idem redrive --plan` must refuse it, not send the letter the planner
// refused.
func TestRedrivePlanFileEditedToSend(t *testing.T) {
	p := newPayments(t)
	p.start()
	p.deadLetter("T02") // failed, not released
	_, shown, _ := idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--dry-run", "--json")
	out := decode[redriveOutput](t, shown)
	if out.Plan == nil || len(out.Plan.Entries) != 1 || out.Plan.Entries[0].Verdict != redrive.VerdictStop {
		t.Fatalf("the dry run's plan %+v, want T02's letter stopped at", out.Plan)
	}
	out.Plan.Entries[0].Verdict, out.Plan.Entries[0].Planned = redrive.VerdictSend, redrive.VerdictStop
	out.Digest = ""
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	plan := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(plan, b, 0o600); err != nil {
		t.Fatal(err)
	}
	topicEnd := p.end(p.topic)
	code, _, _ := idem(t, "", p.envs, "redrive", "--plan", plan, "--json")
	if end := p.end(p.topic); end != topicEnd {
		t.Errorf("an edited plan (verdict send over planned stop) sent %d copies of a letter whose key is failed and not released (exit %d)", end-topicEnd, code)
	}
	if code == exitOK {
		t.Errorf("an edited plan was executed: exit %d, want it refused", code)
	}
}
