package redrive

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// What Run or Execute did with a letter (Result.Action).
const (
	Sent      = "sent"
	WouldSend = "would_send" // Config.DryRun
	Refused   = "refused"    // its queue stops there (VerdictStop)
	Skipped   = "skipped"    // refused, and passed by (VerdictSkip)
	Duplicate = "duplicate"  // its key is done: passed by, not sent (VerdictDuplicate)
)

// DefaultGroup is the group whose committed offsets say where the last
// redrive stopped, when Config.Group is empty.
const DefaultGroup = "idem-redrive"

// DefaultMaxRedrives is Config.MaxRedrives' default.
const DefaultMaxRedrives = 5

// Config is what a redrive does.
type Config struct {
	// Admin is the dedup store's: Run looks each letter's key up in it
	// (Find) and, with Release, releases it. Required.
	Admin dedup.Admin
	// Topic is the dead-letter topic to read. Required.
	Topic string
	// To sends every letter to this topic; default each letter's original
	// topic (wire.MetaTopic). A copy sent elsewhere is a new message
	// there: the consumer does not honour its lineage.
	To string
	// Group is the consumer group whose committed offsets of Topic say
	// where the last redrive stopped; default DefaultGroup.
	Group string
	// Max bounds the letters handled in one run; 0: up to the end.
	Max int
	// MaxRedrives refuses a letter redriven this many times already;
	// default DefaultMaxRedrives.
	MaxRedrives int
	// Release releases a letter's failed key on the way (as idem release
	// does) instead of refusing the letter.
	Release bool
	// DryRun decides about each letter and sends, releases and commits
	// nothing.
	DryRun bool
	// Skip passes refused letters by (commits past them) instead of
	// stopping their queue.
	Skip bool
}

// Result is what Run did with one dead letter. Its JSON is `idem redrive
// --json`'s.
type Result struct {
	Letter  string `json:"letter"` // the letter's position: dlq/partition/offset (Kafka), dlq/broker/queue/offset (RocketMQ)
	Scope   string `json:"scope,omitempty"`
	Key     string `json:"key,omitempty"`
	To      string `json:"to,omitempty"`    // topic/partition (Kafka); topic, and once sent topic/broker/queue (RocketMQ)
	Action  string `json:"action"`          // Sent, WouldSend, Refused, Skipped, Duplicate
	Cause   string `json:"cause,omitempty"` // the letter's idem-cause (wire.MetaCause): why it was dead-lettered
	Reason  string `json:"reason,omitempty"`
	Count   int    `json:"redrive_count,omitempty"`
	Release bool   `json:"released,omitempty"` // its failed row was released on the way (Config.Release)
}

// Broker is where the dead-letter topic lies: Kafka or RocketMQ.
type Broker interface {
	// Name is the broker's kind, "kafka" or "rocketmq".
	Name() string
	open(ctx context.Context, topic, group string) (session, error)
}

// session is one run's connection to a broker. Its methods are called from
// one goroutine.
type session interface {
	// name is q's name in a Plan (Entry.Queue).
	name(q queue) string
	// queues returns the parts of the topic with letters this run reads:
	// from the group's committed offset (or the first letter the broker
	// still has) to the end as it is now, in a fixed order.
	queues(ctx context.Context) ([]queue, error)
	// read hands the letters of q from q.from, in order, to each until each
	// returns false or an error, or the next letter lies at q.to or after.
	read(ctx context.Context, q queue, each func(letter) (bool, error)) error
	// target says where c goes, before it is sent.
	target(c *message) string
	// send sends c and returns where it went.
	send(ctx context.Context, c *message) (string, error)
	// commit commits next as the group's offset of q: where the next run
	// starts.
	commit(ctx context.Context, q queue, next int64) error
	close()
}

// queue is the part [from, to) of one partition (Kafka) or queue
// (RocketMQ) of the topic that this run reads.
type queue struct {
	from, to int64
	ref      any // the session's name of the partition or queue
}

// letter is a dead letter as a session read it.
type letter struct {
	pos        string // Result.Letter
	offset     int64
	key, value []byte
	headers    []consumer.Header
	raw        any // the session's message
}

func (l *letter) header(name string) (string, bool) {
	for _, h := range l.headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

// message is the copy of a letter that goes back.
type message struct {
	topic      string
	partition  int // the original's partition or queue ID (wire.MetaPartition)
	key, value []byte
	headers    []consumer.Header
	letter     *letter
}

// Run redrives cfg.Topic's letters on b: it makes the plan (Prepare) and,
// unless cfg.DryRun, executes it. A dry run and a run are one planner: the
// run does what the dry run shows, letter for letter. Run returns the plan
// it made (executed unless cfg.DryRun; nil when it could not make one) and
// what it did with each letter, even when it returns an error. A run that
// is not dry holds the lock Execute does (see there).
func Run(ctx context.Context, b Broker, cfg Config) (*Plan, []Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, nil, err
	}
	if !cfg.DryRun {
		unlock, err := lock(ctx, b, cfg)
		if err != nil {
			return nil, nil, err
		}
		defer unlock()
	}
	s, err := b.open(ctx, cfg.Topic, cfg.Group)
	if err != nil {
		return nil, nil, err
	}
	defer s.close()
	r := &run{cfg: cfg, s: s}
	p, err := r.plan(ctx, b.Name())
	if err != nil {
		return nil, nil, err
	}
	if cfg.DryRun {
		return p, p.results(), nil
	}
	res, err := r.execute(ctx, p, false)
	return p, res, err
}

// Prepare makes the plan of a redrive of cfg.Topic on b and changes
// nothing: from where the last redrive of cfg.Group stopped to the topic's
// end as it is now, queue by queue, at most cfg.Max letters. A letter is
// sent (VerdictSend); or passed by as a duplicate when its key is done
// (VerdictDuplicate); or refused, and then its queue stops there
// (VerdictStop) unless cfg.Skip passes it by (VerdictSkip). cfg.DryRun
// does not matter.
func Prepare(ctx context.Context, b Broker, cfg Config) (*Plan, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s, err := b.open(ctx, cfg.Topic, cfg.Group)
	if err != nil {
		return nil, err
	}
	defer s.close()
	return (&run{cfg: cfg, s: s}).plan(ctx, b.Name())
}

// Execute does what p says, exactly: each letter it lists, by its
// position, and no other. It first makes the plan again for the letters
// p lists (from the group's offset now to the last of them in each queue)
// and refuses p with a *StaleError when that plan differs: another
// redrive ran since, a letter's key was applied or released, a queue's
// letters moved. Letters written after p was made are not in it and wait
// for the next plan. The operator's changes (Plan.SkipLetter, Plan.Hold) are
// kept. Executions of plans of one topic and group, in any process, run
// one at a time (admin.Lock): of one plan confirmed twice at once, the
// second is stale. admin is the dedup store's (Config.Admin). The results say what
// was done even when Execute returns an error.
func Execute(ctx context.Context, b Broker, admin dedup.Admin, p *Plan) ([]Result, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	if p.Broker != b.Name() {
		return nil, fmt.Errorf("redrive: the plan is of a %s topic, not %s", p.Broker, b.Name())
	}
	cfg, err := Config{Admin: admin, Topic: p.Topic, To: p.To, Group: p.Group, MaxRedrives: p.MaxRedrives,
		Release: p.Release, Skip: p.Skip}.withDefaults()
	if err != nil {
		return nil, err
	}
	// Two confirmations of one plan (two --plan runs, two console pages)
	// must not both recheck it before either commits: one at a time, the
	// second finds the group's offset moved and the plan stale.
	unlock, err := lock(ctx, b, cfg)
	if err != nil {
		return nil, err
	}
	defer unlock()
	s, err := b.open(ctx, cfg.Topic, cfg.Group)
	if err != nil {
		return nil, err
	}
	defer s.close()
	return (&run{cfg: cfg, s: s}).execute(ctx, p, true)
}

// lock takes the store's lock of cfg's topic and group on b: runs and
// executions of plans of one topic and group, in any process, send and
// commit one at a time.
func lock(ctx context.Context, b Broker, cfg Config) (func(), error) {
	unlock, err := cfg.Admin.Lock(ctx, "redrive "+b.Name()+" "+cfg.Topic+" "+cfg.Group)
	if err != nil {
		return nil, fmt.Errorf("redrive: waiting for another redrive of %s (group %s): %w", cfg.Topic, cfg.Group, err)
	}
	return unlock, nil
}

func (cfg Config) withDefaults() (Config, error) {
	switch {
	case cfg.Admin == nil:
		return cfg, errors.New("redrive: Config.Admin is required")
	case cfg.Topic == "":
		return cfg, errors.New("redrive: Config.Topic (the dead-letter topic) is required")
	case cfg.Max < 0:
		return cfg, fmt.Errorf("redrive: Config.Max %d is negative", cfg.Max)
	case cfg.MaxRedrives < 0:
		return cfg, fmt.Errorf("redrive: Config.MaxRedrives %d is negative", cfg.MaxRedrives)
	}
	if cfg.Group == "" {
		cfg.Group = DefaultGroup
	}
	if cfg.MaxRedrives == 0 {
		cfg.MaxRedrives = DefaultMaxRedrives
	}
	return cfg, nil
}

type run struct {
	cfg Config
	s   session
}

// plan reads the letters of each queue and decides about each.
func (r *run) plan(ctx context.Context, broker string) (*Plan, error) {
	qs, err := r.s.queues(ctx)
	if err != nil {
		return nil, err
	}
	p := &Plan{Broker: broker, Topic: r.cfg.Topic, Group: r.cfg.Group, To: r.cfg.To, MaxRedrives: r.cfg.MaxRedrives,
		Release: r.cfg.Release, Skip: r.cfg.Skip, Entries: []Entry{}}
	for _, q := range qs {
		if r.cfg.Max > 0 && len(p.Entries) >= r.cfg.Max {
			break
		}
		err := r.s.read(ctx, q, func(l letter) (bool, error) {
			e, _, err := r.decide(ctx, q, &l)
			if err != nil {
				return false, err
			}
			p.Entries = append(p.Entries, e)
			return e.Verdict != VerdictStop && (r.cfg.Max == 0 || len(p.Entries) < r.cfg.Max), nil
		})
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// execute does p's entries, queue by queue. With check, it first makes
// the plan again for p's letters and refuses p if it differs; and it
// checks each letter again as it reads it for the send.
func (r *run) execute(ctx context.Context, p *Plan, check bool) ([]Result, error) {
	qs, err := r.s.queues(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]queue{}
	for _, q := range qs {
		byName[r.s.name(q)] = q
	}
	var order []string
	shown := map[string][]Entry{}
	for _, e := range p.Entries {
		if _, ok := shown[e.Queue]; !ok {
			order = append(order, e.Queue)
		}
		shown[e.Queue] = append(shown[e.Queue], e)
	}
	if check {
		for _, name := range order {
			if err := r.recheck(ctx, name, byName, shown[name]); err != nil {
				return nil, err
			}
		}
	}
	var out []Result
	for _, name := range order {
		q, es := byName[name], shown[name]
		i, stopped := 0, false
		err := r.s.read(ctx, q, func(l letter) (bool, error) {
			e := es[i]
			fresh, c, err := r.decide(ctx, q, &l)
			if err != nil {
				return false, err
			}
			// The letter is the one planned. Its verdict was checked before
			// (recheck); it may have changed since by this run's own doing
			// (a key released, or applied, for an earlier letter of it); a
			// failed row it finds must be the one shown, if it is to release
			// it.
			if fresh.Letter != e.Letter || fresh.Scope != e.Scope || fresh.Key != e.Key || fresh.To != e.To || fresh.Count != e.Count ||
				e.Verdict == VerdictSend && c == nil ||
				e.Verdict == VerdictSend && e.Release && fresh.Release && !fresh.FailedAt.Equal(e.FailedAt) {
				return false, &StaleError{Letter: fresh.Letter, Shown: describe(&e), Now: describe(&fresh)}
			}
			i++
			res := e.result(false)
			switch e.Verdict {
			case VerdictStop:
				out = append(out, res)
				stopped = true
				return false, nil // the queue stops at a refused letter: the next run starts with it
			case VerdictSend:
				if e.Release {
					if _, err := r.cfg.Admin.Release(ctx, []dedup.Key{{Scope: e.Scope, ID: e.Key}}, false); err != nil {
						return false, err
					}
				}
				c.headers = lineage(&l, e.Count)
				at, err := r.s.send(ctx, c)
				if err != nil {
					return false, err
				}
				res.To, res.Action = at, Sent
			}
			out = append(out, res)
			if err := r.s.commit(ctx, q, l.offset+1); err != nil {
				return false, err
			}
			return i < len(es), nil
		})
		if err != nil {
			return out, err
		}
		if i < len(es) && !stopped {
			return out, &StaleError{Letter: es[i].Letter, Shown: describe(&es[i]), Now: describe(nil)}
		}
	}
	return out, nil
}

// recheck makes the plan of one queue again, from the group's offset now
// to the last letter shown, and compares it with the shown entries.
func (r *run) recheck(ctx context.Context, name string, byName map[string]queue, es []Entry) error {
	q, ok := byName[name]
	if !ok {
		return &StaleError{Letter: es[0].Letter, Shown: describe(&es[0]), Now: "its queue " + name + " has no letter to redrive (another redrive passed it, or it was deleted)"}
	}
	if q.to > es[len(es)-1].Offset+1 {
		q.to = es[len(es)-1].Offset + 1
	}
	var fresh []Entry
	err := r.s.read(ctx, q, func(l letter) (bool, error) {
		e, _, err := r.decide(ctx, q, &l)
		if err != nil {
			return false, err
		}
		fresh = append(fresh, e)
		return e.Verdict != VerdictStop, nil
	})
	if err != nil {
		return err
	}
	for i := range max(len(es), len(fresh)) {
		var s, f *Entry
		if i < len(es) {
			s = &es[i]
		}
		if i < len(fresh) {
			f = &fresh[i]
		}
		if s != nil && f != nil && same(*s, *f) {
			continue
		}
		letter := "queue " + name
		if s != nil {
			letter = s.Letter
		} else if f != nil {
			letter = f.Letter
		}
		return &StaleError{Letter: letter, Shown: describe(s), Now: describe(f)}
	}
	return nil
}

// decide is the planner's verdict on one letter of q, and the copy it
// would send (nil when its headers allow none, whatever the verdict).
func (r *run) decide(ctx context.Context, q queue, l *letter) (Entry, *message, error) {
	e := Entry{Letter: l.pos, Queue: r.s.name(q), Offset: l.offset}
	var c *message // the copy, once the letter's headers allow one
	refuse := func(format string, args ...any) (Entry, *message, error) {
		e.Verdict, e.Reason = VerdictStop, fmt.Sprintf(format, args...)
		if r.cfg.Skip {
			e.Verdict = VerdictSkip
		}
		return e, c, nil
	}
	e.Cause, _ = l.header(wire.MetaCause)
	e.Scope, _ = l.header(wire.MetaKeyScope)
	e.Key, _ = l.header(wire.MetaKey)
	to := r.cfg.To
	if to == "" {
		to, _ = l.header(wire.MetaTopic)
	}
	partition, _ := l.header(wire.MetaPartition)
	p, perr := strconv.Atoi(partition)
	count := 0
	if c, ok := l.header(wire.MetaRedriveCount); ok {
		count, _ = strconv.Atoi(c)
	}
	e.Count = count + 1
	_, leftOut := l.header(wire.MetaValueSHA256)
	switch {
	case to == "":
		return refuse("no %s header: not an idem dead letter (use --to)", wire.MetaTopic)
	case perr != nil:
		return refuse("no valid %s header", wire.MetaPartition)
	case e.Scope == "" || e.Key == "":
		return refuse("no key: it was dead-lettered before its key was known (bad input); it would fail the same way")
	}
	c = &message{topic: to, partition: p, key: l.key, value: l.value, letter: l}
	e.To = r.s.target(c)
	rows, err := r.cfg.Admin.Find(ctx, e.Scope, e.Key)
	if err != nil {
		return e, nil, err
	}
	// A letter whose key is done is a duplicate whatever else it says (its
	// redrive count, a value left out): passed by, never a stop.
	if slices.ContainsFunc(rows, func(row dedup.Row) bool { return row.Outcome == "done" }) {
		e.Verdict, e.Reason = VerdictDuplicate, doneReason(e.Cause, l)
		return e, c, nil
	}
	switch {
	case count >= r.cfg.MaxRedrives:
		// Before the value's case, so that a letter without a value (a
		// tombstone, an empty body), which is sent on, is refused too.
		c = nil
		return refuse("redriven %d times already (--max-redrives)", count)
	case leftOut:
		c = nil
		return refuse("its value was left out of the dead letter (too large)")
	}
	for _, row := range rows {
		switch row.Outcome {
		case "failed":
			if !r.cfg.Release {
				return refuse("the key is recorded as failed: release it first (idem release --scope %s %s), or use --release", e.Scope, e.Key)
			}
			e.Release, e.FailedAt = true, row.CreatedAt
		}
	}
	e.Verdict = VerdictSend
	return e, c, nil
}

// results is what a dry run shows of p.
func (p *Plan) results() []Result {
	out := make([]Result, 0, len(p.Entries))
	for _, e := range p.Entries {
		out = append(out, e.result(true))
	}
	return out
}

// doneReason says why a letter whose key is done is passed by. A done
// row is an applied key, or an event entity order recorded stale (its
// claim commits with its stale record): a stale letter's event was never
// applied, and an in_doubt letter of an entity's event whose key is done
// may be a stale event whose provider call is not booked — a copy books
// nothing either way.
func doneReason(cause string, l *letter) string {
	entity, named := l.header(wire.MetaEntity)
	switch {
	case cause == wire.CauseStale.String():
		version, _ := l.header(wire.MetaEntityVersion)
		watermark, _ := l.header(wire.MetaEntityWatermark)
		return fmt.Sprintf("the event was recorded stale, never applied (entity %q, version %s at or below watermark %s; idem stale): a copy would be a duplicate; passed by",
			entity, version, watermark)
	case cause == wire.CauseInDoubt.String() && named:
		return fmt.Sprintf("the key is done: applied by a later copy, or recorded stale with its provider steps (entity %q; idem stale, idem effects), and then nothing books its effect: book it by hand; a copy would be a duplicate; passed by",
			entity)
	}
	return "the key was applied (a done row): a copy would be a duplicate; passed by"
}

// result is e as a Result: what a dry run shows, or (dry false) what a run
// did with a letter it did not send.
func (e Entry) result(dry bool) Result {
	res := Result{Letter: e.Letter, Scope: e.Scope, Key: e.Key, To: e.To, Cause: e.Cause, Reason: e.Reason, Count: e.Count, Release: e.Release}
	switch e.Verdict {
	case VerdictSend:
		res.Action = WouldSend
	case VerdictDuplicate:
		res.Action = Duplicate
	case VerdictSkip:
		res.Action = Skipped
	case VerdictStop:
		res.Action = Refused
	}
	return res
}

// lineage returns the headers of a letter's copy: the message's own headers
// (traceparent included), its original coordinates, message ID and key,
// and the redrive's count and the letter it came from — without the
// letter's own metadata (its reason, cause, fingerprint, attempts, lane).
func lineage(l *letter, count int) []consumer.Header {
	headers := make([]consumer.Header, 0, len(l.headers)+2)
	for _, h := range l.headers {
		switch h.Key {
		case wire.MetaReason, wire.MetaCause, wire.MetaFingerprint, wire.MetaAttempts, wire.MetaAttempt, wire.MetaLane,
			wire.MetaRedriveCount, wire.MetaRedrivenFrom:
			// the letter's own, or replaced below
		default:
			headers = append(headers, h)
		}
	}
	return append(headers,
		consumer.Header{Key: wire.MetaRedriveCount, Value: []byte(strconv.Itoa(count))},
		consumer.Header{Key: wire.MetaRedrivenFrom, Value: []byte(l.pos)})
}
