package redrive

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// fakeBroker is one queue of letters, with what was sent and committed.
type fakeBroker struct {
	letters   []letter
	committed int64
	sent      []*message
	commits   []int64
	sendErr   error
}

func (*fakeBroker) Name() string { return "fake" }

func (b *fakeBroker) open(context.Context, string, string) (session, error) { return b, nil }

func (b *fakeBroker) queues(context.Context) ([]queue, error) {
	return []queue{{from: b.committed, to: int64(len(b.letters))}}, nil
}

func (b *fakeBroker) read(_ context.Context, q queue, each func(letter) (bool, error)) error {
	for _, l := range b.letters[q.from:q.to] {
		if more, err := each(l); err != nil || !more {
			return err
		}
	}
	return nil
}

func (b *fakeBroker) name(queue) string { return "0" }

func (b *fakeBroker) target(c *message) string { return fmt.Sprintf("%s/%d", c.topic, c.partition) }

func (b *fakeBroker) send(_ context.Context, c *message) (string, error) {
	if b.sendErr != nil {
		return "", b.sendErr
	}
	b.sent = append(b.sent, c)
	return b.target(c), nil
}

func (b *fakeBroker) commit(_ context.Context, _ queue, next int64) error {
	b.committed = next
	b.commits = append(b.commits, next)
	return nil
}

func (b *fakeBroker) close() {}

// fakeAdmin holds rows by key ID.
type fakeAdmin struct {
	dedup.Admin
	rows     map[string]string    // key ID → outcome
	created  map[string]time.Time // key ID → its row's created time; zero when missing
	released []string
	locks    int // Lock calls
	unlocks  int
}

func (a *fakeAdmin) Find(_ context.Context, scope, id string) ([]dedup.Row, error) {
	if o, ok := a.rows[id]; ok {
		return []dedup.Row{{Key: dedup.Key{Scope: scope, ID: id}, Outcome: o, CreatedAt: a.created[id]}}, nil
	}
	return nil, nil
}

// Lock serializes nothing (these tests execute one plan at a time); it
// counts the locks taken and let go.
func (a *fakeAdmin) Lock(context.Context, string) (func(), error) {
	a.locks++
	return func() { a.unlocks++ }, nil
}

func (a *fakeAdmin) Release(_ context.Context, keys []dedup.Key, dry bool) ([]dedup.Row, error) {
	if dry {
		return nil, errors.New("redrive releases nothing in a dry run")
	}
	for _, k := range keys {
		delete(a.rows, k.ID)
		a.released = append(a.released, k.ID)
	}
	return nil, nil
}

// dl builds the letter at offset: idem's metadata, then changes (an empty
// value deletes the header).
func dl(offset int64, key string, changes ...string) letter {
	h := map[string]string{
		"traceparent": "00-1", wire.MetaReason: "permanent: no", wire.MetaAttempts: "1",
		wire.MetaTopic: "pay", wire.MetaPartition: "2", wire.MetaLane: "pay/2", wire.MetaOffset: "40",
		wire.MetaMessageID: "pay/2/40", wire.MetaAttempt: "1", wire.MetaKeyScope: "pay", wire.MetaKey: key,
	}
	for i := 0; i+1 < len(changes); i += 2 {
		if changes[i+1] == "" {
			delete(h, changes[i])
		} else {
			h[changes[i]] = changes[i+1]
		}
	}
	l := letter{pos: fmt.Sprintf("pay.dlq/0/%d", offset), offset: offset, key: []byte(key), value: []byte(`{"txn":"` + key + `"}`)}
	for _, k := range slices.Sorted(maps.Keys(h)) {
		l.headers = append(l.headers, consumer.Header{Key: k, Value: []byte(h[k])})
	}
	return l
}

func TestRefusals(t *testing.T) {
	for _, c := range []struct {
		name   string
		letter letter
		row    string // the key's outcome in the store
		reason string
	}{
		{"not a letter", dl(0, "K", wire.MetaTopic, ""), "", "not an idem dead letter"},
		{"no partition", dl(0, "K", wire.MetaPartition, "x"), "", "no valid " + wire.MetaPartition},
		{"no key", dl(0, "", wire.MetaKey, ""), "", "no key"},
		{"redriven too often", dl(0, "K", wire.MetaRedriveCount, "3"), "", "redriven 3 times already"},
		{"value left out", dl(0, "K", wire.MetaValueSHA256, "ab"), "", "left out"},
		{"failed", dl(0, "K"), "failed", "release it first"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &fakeBroker{letters: []letter{c.letter, dl(1, "L")}}
			admin := &fakeAdmin{rows: map[string]string{}}
			if c.row != "" {
				admin.rows["K"] = c.row
			}
			res, err := run2(context.Background(), b, Config{Admin: admin, Topic: "pay.dlq", MaxRedrives: 3})
			if err != nil || len(res) != 1 || res[0].Action != Refused || !strings.Contains(res[0].Reason, c.reason) {
				t.Fatalf("results %+v, %v; want one refused: %q", res, err, c.reason)
			}
			if len(b.sent) != 0 || len(b.commits) != 0 {
				t.Errorf("a refused letter: sent %d, commits %v; want the queue stopped at it", len(b.sent), b.commits)
			}
			// --skip passes it by and goes on.
			res, err = run2(context.Background(), b, Config{Admin: admin, Topic: "pay.dlq", MaxRedrives: 3, Skip: true})
			if err != nil || len(res) != 2 || res[0].Action != Skipped || res[1].Action != Sent || !slices.Equal(b.commits, []int64{1, 2}) {
				t.Errorf("with Skip: %+v, %v, commits %v", res, err, b.commits)
			}
		})
	}
}

// TestLineage: the copy carries the message's headers, the original's
// coordinates, ID and key, the redrive's count and the letter it came
// from; not the letter's reason, attempts or lane.
func TestLineage(t *testing.T) {
	b := &fakeBroker{letters: []letter{dl(0, "K", wire.MetaRedriveCount, "1", wire.MetaRedrivenFrom, "pay.dlq/0/9")}}
	res, err := run2(context.Background(), b, Config{Admin: &fakeAdmin{}, Topic: "pay.dlq"})
	if err != nil || len(res) != 1 || res[0].Action != Sent || res[0].Count != 2 || res[0].To != "pay/2" {
		t.Fatalf("results %+v, %v", res, err)
	}
	got := map[string][]string{}
	for _, h := range b.sent[0].headers {
		got[h.Key] = append(got[h.Key], string(h.Value))
	}
	want := map[string][]string{
		"traceparent": {"00-1"}, wire.MetaTopic: {"pay"}, wire.MetaPartition: {"2"}, wire.MetaOffset: {"40"},
		wire.MetaMessageID: {"pay/2/40"}, wire.MetaKeyScope: {"pay"}, wire.MetaKey: {"K"},
		wire.MetaRedriveCount: {"2"}, wire.MetaRedrivenFrom: {"pay.dlq/0/0"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("copy headers\n got %v\nwant %v", got, want)
	}
	if c := b.sent[0]; c.topic != "pay" || c.partition != 2 || string(c.key) != "K" || string(c.value) != `{"txn":"K"}` {
		t.Errorf("copy %+v", c)
	}
}

// TestCommitAfterSend: a failed send commits nothing, so that the next run
// starts with the letter; Max bounds a run; Release releases on the way,
// but not in a dry run, which sends and commits nothing either.
func TestCommitAfterSend(t *testing.T) {
	ctx := context.Background()
	b := &fakeBroker{letters: []letter{dl(0, "A"), dl(1, "B"), dl(2, "C")}, sendErr: errors.New("broker down")}
	admin := &fakeAdmin{rows: map[string]string{"B": "failed"}}
	if res, err := run2(ctx, b, Config{Admin: admin, Topic: "pay.dlq"}); err == nil || len(res) != 0 || len(b.commits) != 0 {
		t.Fatalf("a failed send: %+v, %v, commits %v", res, err, b.commits)
	}
	b.sendErr = nil
	res, err := run2(ctx, b, Config{Admin: admin, Topic: "pay.dlq", Release: true, DryRun: true})
	if err != nil || len(res) != 3 || res[1].Action != WouldSend || !res[1].Release || len(admin.released) != 0 || len(b.sent) != 0 || len(b.commits) != 0 {
		t.Fatalf("dry run: %+v, %v; released %v, sent %d, commits %v", res, err, admin.released, len(b.sent), b.commits)
	}
	res, err = run2(ctx, b, Config{Admin: admin, Topic: "pay.dlq", Release: true, Max: 2})
	if err != nil || len(res) != 2 || res[1].Action != Sent || !res[1].Release || !slices.Equal(admin.released, []string{"B"}) || !slices.Equal(b.commits, []int64{1, 2}) {
		t.Fatalf("Max 2 with Release: %+v, %v; released %v, commits %v", res, err, admin.released, b.commits)
	}
	if res, err := run2(ctx, b, Config{Admin: admin, Topic: "pay.dlq"}); err != nil || len(res) != 1 || res[0].Letter != "pay.dlq/0/2" {
		t.Errorf("the next run: %+v, %v; want it to start at the third letter", res, err)
	}
}

// TestDryRunIsTheRun: a queue with a refused letter in the middle. The dry
// run lists what the run does, letter for letter: the letters before it
// sent, the queue stopped at it, nothing after it.
func TestDryRunIsTheRun(t *testing.T) {
	ctx := context.Background()
	b := &fakeBroker{letters: []letter{dl(0, "A"), dl(1, "B"), dl(2, "C")}}
	admin := &fakeAdmin{rows: map[string]string{"B": "failed"}}
	dry, err := run2(ctx, b, Config{Admin: admin, Topic: "pay.dlq", DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := run2(ctx, b, Config{Admin: admin, Topic: "pay.dlq"})
	if err != nil {
		t.Fatal(err)
	}
	actions := func(rs []Result) (out []string) {
		for _, r := range rs {
			out = append(out, r.Letter+" "+strings.Replace(r.Action, WouldSend, Sent, 1))
		}
		return out
	}
	if got, want := actions(dry), actions(res); !slices.Equal(got, want) {
		t.Errorf("the dry run shows %v, the run did %v", got, want)
	}
	if len(b.sent) != 1 || !slices.Equal(b.commits, []int64{1}) {
		t.Errorf("sent %d, commits %v; want A sent, the queue stopped at B", len(b.sent), b.commits)
	}
}

// TestDuplicateIsPassedBy: a letter whose key is done is a duplicate:
// committed past, not sent, and the letters after it go on.
func TestDuplicateIsPassedBy(t *testing.T) {
	b := &fakeBroker{letters: []letter{dl(0, "K"), dl(1, "K", wire.MetaCause, "failed_before"), dl(2, "L")}}
	admin := &fakeAdmin{rows: map[string]string{"K": "done"}}
	res, err := run2(context.Background(), b, Config{Admin: admin, Topic: "pay.dlq"})
	if err != nil || len(res) != 3 || res[0].Action != Duplicate || res[1].Action != Duplicate || res[2].Action != Sent {
		t.Fatalf("results %+v, %v", res, err)
	}
	if len(b.sent) != 1 || string(b.sent[0].key) != "L" || !slices.Equal(b.commits, []int64{1, 2, 3}) {
		t.Errorf("sent %d, commits %v; want L sent, the two K letters passed by", len(b.sent), b.commits)
	}
}

// TestExecuteDoesThePlan: Execute sends the letters the plan lists and no
// later one; it refuses a plan that no longer holds (a key applied since,
// another redrive passed a letter) and then does nothing; the operator's
// SkipLetter and Hold are done as shown.
func TestExecuteDoesThePlan(t *testing.T) {
	ctx := context.Background()
	admin := &fakeAdmin{rows: map[string]string{}}
	cfg := Config{Admin: admin, Topic: "pay.dlq"}
	b := &fakeBroker{letters: []letter{dl(0, "A"), dl(1, "B")}}
	p, err := Prepare(ctx, b, cfg)
	if err != nil || len(p.Entries) != 2 {
		t.Fatalf("plan %+v, %v", p, err)
	}
	b.letters = append(b.letters, dl(2, "C")) // written after the plan
	res, err := Execute(ctx, b, admin, p)
	if err != nil || len(res) != 2 || len(b.sent) != 2 || !slices.Equal(b.commits, []int64{1, 2}) {
		t.Fatalf("execute: %+v, %v; sent %d, commits %v", res, err, len(b.sent), b.commits)
	}

	for name, change := range map[string]func(b *fakeBroker){
		"key applied":      func(*fakeBroker) { admin.rows["D"] = "done" },
		"group moved past": func(b *fakeBroker) { b.committed++ },
	} {
		t.Run(name, func(t *testing.T) {
			clear(admin.rows)
			b := &fakeBroker{letters: []letter{dl(0, "D"), dl(1, "E")}}
			p, err := Prepare(ctx, b, cfg)
			if err != nil {
				t.Fatal(err)
			}
			change(b)
			var stale *StaleError
			res, err := Execute(ctx, b, admin, p)
			if !errors.As(err, &stale) || !strings.HasPrefix(err.Error(), "stale plan: pay.dlq/0/0") || len(res) != 0 || len(b.sent) != 0 {
				t.Errorf("execute: %+v, %v; sent %d", res, err, len(b.sent))
			}
		})
	}

	clear(admin.rows)
	b = &fakeBroker{letters: []letter{dl(0, "F"), dl(1, "G"), dl(2, "H")}}
	if p, err = Prepare(ctx, b, cfg); err != nil {
		t.Fatal(err)
	}
	if err := p.SkipLetter("pay.dlq/0/0"); err != nil {
		t.Fatal(err)
	}
	if err := p.Hold("pay.dlq/0/2"); err != nil || len(p.Entries) != 2 {
		t.Fatalf("hold: %v %+v", err, p.Entries)
	}
	res, err = Execute(ctx, b, admin, p)
	if err != nil || len(res) != 2 || res[0].Action != Skipped || res[1].Action != Sent || len(b.sent) != 1 || !slices.Equal(b.commits, []int64{1, 2}) {
		t.Errorf("the operator's plan: %+v, %v; sent %d, commits %v", res, err, len(b.sent), b.commits)
	}
	if d := p.Digest(); len(d) != 16 || d == (&Plan{}).Digest() {
		t.Errorf("digest %q", d)
	}
}

// run2 is Run without its plan.
func run2(ctx context.Context, b Broker, cfg Config) ([]Result, error) {
	_, res, err := Run(ctx, b, cfg)
	return res, err
}

// TestExecuteRefusesAVerdictThePlannerNeverGave: a plan passed back
// (`idem redrive --plan FILE`) may have been edited by hand. The
// operator's one change of a verdict is to skip a letter (SkipLetter:
// Verdict skip, Planned the planner's). A file that says Verdict send
// with Planned stop (a key recorded failed, not released) or Planned
// skip_duplicate (a key applied) passes the recheck, which compares
// Planned with a fresh plan, and Execute then sends what the planner
// refused: an operator action must execute the plan shown, nothing the
// planner never said.
func TestExecuteRefusesAVerdictThePlannerNeverGave(t *testing.T) {
	for _, c := range []struct {
		name, outcome, planned string
	}{
		{"a refused letter sent", "failed", VerdictStop},
		{"a duplicate sent", "done", VerdictDuplicate},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			admin := &fakeAdmin{rows: map[string]string{"A": c.outcome}}
			b := &fakeBroker{letters: []letter{dl(0, "A")}}
			p, err := Prepare(ctx, b, Config{Admin: admin, Topic: "pay.dlq"})
			if err != nil || len(p.Entries) != 1 || p.Entries[0].Verdict != c.planned {
				t.Fatalf("plan %+v, %v; want one letter, %s", p, err, c.planned)
			}
			p.Entries[0].Verdict, p.Entries[0].Planned = VerdictSend, c.planned // edited by hand
			res, err := Execute(ctx, b, admin, p)
			if len(b.sent) != 0 {
				t.Errorf("Execute sent %d copies of a letter the planner said %s of (a plan edited to verdict send, planned %s); "+
					"results %+v, err %v", len(b.sent), c.planned, c.planned, res, err)
			}
			if err == nil {
				t.Errorf("Execute accepted a verdict the planner never gives (send over planned %s)", c.planned)
			}
		})
	}
}

// TestExecuteReleasesTheFailedRowShown: with --release, the plan shows a
// letter whose key's failed row is released on the way. When that row was
// released and the key failed again since (another row, recorded later),
// Execute must not release the new failure, which the operator never saw:
// the plan is stale, nothing is released or sent.
func TestExecuteReleasesTheFailedRowShown(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	admin := &fakeAdmin{rows: map[string]string{"A": "failed"}, created: map[string]time.Time{"A": t0}}
	b := &fakeBroker{letters: []letter{dl(0, "A")}}
	p, err := Prepare(ctx, b, Config{Admin: admin, Topic: "pay.dlq", Release: true})
	if err != nil || len(p.Entries) != 1 || !p.Entries[0].Release || !p.Entries[0].FailedAt.Equal(t0) {
		t.Fatalf("plan %+v, %v; want A sent, its failed row of %v released", p, err, t0)
	}
	admin.created["A"] = t0.Add(time.Hour) // released, and failed again
	var stale *StaleError
	res, err := Execute(ctx, b, admin, p)
	if !errors.As(err, &stale) || len(b.sent) != 0 || len(admin.released) != 0 {
		t.Errorf("Execute over another failed row than shown: %+v, %v; sent %d, released %v; want it stale, nothing done",
			res, err, len(b.sent), admin.released)
	}
	admin.created["A"] = t0 // the row shown
	if res, err := Execute(ctx, b, admin, p); err != nil || len(b.sent) != 1 || !slices.Equal(admin.released, []string{"A"}) {
		t.Errorf("Execute over the row shown: %+v, %v; sent %d, released %v", res, err, len(b.sent), admin.released)
	}
}

// TestRunsAndExecutionsTakeTheLock: a redrive that sends (Run, not dry;
// Execute) holds the store's lock of its topic and group, so that two at
// once — a plain run beside a confirmed plan — do not both read the
// group's offset before either commits; a dry run (Prepare) takes none.
func TestRunsAndExecutionsTakeTheLock(t *testing.T) {
	ctx := context.Background()
	admin := &fakeAdmin{rows: map[string]string{}}
	b := &fakeBroker{letters: []letter{dl(0, "A"), dl(1, "B")}}
	cfg := Config{Admin: admin, Topic: "pay.dlq", Max: 1}
	p, err := Prepare(ctx, b, cfg)
	if err != nil || admin.locks != 0 {
		t.Fatalf("Prepare: %v; %d locks, want none", err, admin.locks)
	}
	if _, err := Execute(ctx, b, admin, p); err != nil || admin.locks != 1 || admin.unlocks != 1 {
		t.Errorf("Execute: %v; %d locks, %d let go, want 1, 1", err, admin.locks, admin.unlocks)
	}
	if _, err := run2(ctx, b, cfg); err != nil || admin.locks != 2 || admin.unlocks != 2 || len(b.sent) != 2 {
		t.Errorf("Run: %v; %d locks, %d let go, want 2, 2; sent %d", err, admin.locks, admin.unlocks, len(b.sent))
	}
}

// TestDoneKeyIsADuplicateWhateverElse: a letter whose key is done is a
// duplicate even when it was redriven --max-redrives times already or its
// value was left out: passed by, never a stop that holds its partition.
func TestDoneKeyIsADuplicateWhateverElse(t *testing.T) {
	b := &fakeBroker{letters: []letter{
		dl(0, "K", wire.MetaRedriveCount, "5"),
		dl(1, "K", wire.MetaValueSHA256, "00"),
		dl(2, "L"),
	}}
	admin := &fakeAdmin{rows: map[string]string{"K": "done"}}
	res, err := run2(context.Background(), b, Config{Admin: admin, Topic: "pay.dlq"})
	if err != nil || len(res) != 3 || res[0].Action != Duplicate || res[1].Action != Duplicate || res[2].Action != Sent {
		t.Fatalf("results %+v, %v; want the done key's letters passed by as duplicates and L sent", res, err)
	}
}

// TestDoneReasonSaysWhatADoneKeyMeans: a letter whose key is done is
// passed by; the reason says the key was applied only when that is all a
// done row can mean. A stale letter's event was recorded stale, never
// applied; an in_doubt letter of an entity's event may be a stale event
// whose provider call nothing booked.
func TestDoneReasonSaysWhatADoneKeyMeans(t *testing.T) {
	h := func(kv ...string) *letter {
		l := &letter{}
		for i := 0; i < len(kv); i += 2 {
			l.headers = append(l.headers, consumer.Header{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return l
	}
	for _, c := range []struct {
		cause string
		l     *letter
		want  []string
	}{
		{"permanent", h(), []string{"the key was applied"}},
		{"in_doubt", h(), []string{"the key was applied"}},
		{"stale", h(wire.MetaEntity, "T1", wire.MetaEntityVersion, "3.0", wire.MetaEntityWatermark, "5.0"),
			[]string{"recorded stale, never applied", `entity "T1", version 3.0 at or below watermark 5.0`}},
		{"in_doubt", h(wire.MetaEntity, "T1", wire.MetaEntityVersion, "3.0"),
			[]string{"recorded stale with its provider steps", "book it by hand"}},
	} {
		got := doneReason(c.cause, c.l)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("cause %s, headers %v: reason %q, want it to say %q", c.cause, c.l.headers, got, w)
			}
		}
	}
}
