package redrive

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// What the planner decides about a letter (Entry.Verdict).
const (
	// VerdictSend: the letter is sent back with its lineage, and the
	// group's offset committed past it.
	VerdictSend = "send"
	// VerdictDuplicate: the letter's key is done (applied): a copy would be
	// a duplicate. The group's offset is committed past it; nothing is
	// sent.
	VerdictDuplicate = "skip_duplicate"
	// VerdictSkip: the letter is refused (Entry.Reason) and passed by
	// (Config.Skip, or the operator's Plan.SkipLetter): committed past, not sent.
	VerdictSkip = "skip"
	// VerdictStop: the letter is refused (Entry.Reason) and its queue stops
	// there: nothing after it in its queue is planned, and the next run
	// starts with it.
	VerdictStop = "stop"
)

// Plan is what a redrive will do, letter by letter: Prepare makes it,
// `idem redrive --dry-run` prints it, Execute does exactly it or refuses it
// as stale. Its JSON is stable (fields in a fixed order), so that it can
// be stored, passed back (`idem redrive --plan FILE`) and recorded; Digest
// names it.
type Plan struct {
	Broker      string `json:"broker"` // Broker.Name: kafka or rocketmq
	Topic       string `json:"topic"`  // the dead-letter topic
	Group       string `json:"group"`  // the redrive's consumer group
	To          string `json:"to,omitempty"`
	MaxRedrives int    `json:"max_redrives"`
	Release     bool   `json:"release,omitempty"` // Config.Release
	Skip        bool   `json:"skip,omitempty"`    // Config.Skip
	// Entries are the letters in the order they are handled: queue by
	// queue, each from the group's offset on, without a gap, up to the
	// end as it was (or Config.Max letters in all, or a VerdictStop).
	Entries []Entry `json:"entries"`
}

// Entry is one letter of a Plan and its verdict.
type Entry struct {
	Letter  string `json:"letter"` // dlq/partition/offset (Kafka), dlq/broker/queue/offset (RocketMQ)
	Queue   string `json:"queue"`  // the partition (Kafka), broker/queue (RocketMQ)
	Offset  int64  `json:"offset"`
	Scope   string `json:"scope,omitempty"`
	Key     string `json:"key,omitempty"`
	To      string `json:"to,omitempty"` // where a copy goes: topic/partition (Kafka), topic (RocketMQ)
	Verdict string `json:"verdict"`      // VerdictSend, VerdictDuplicate, VerdictSkip, VerdictStop
	// Planned is the planner's verdict when the operator changed it
	// (Plan.SkipLetter); empty otherwise. Execute checks the planner's verdict.
	Planned string `json:"planned,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Cause   string `json:"cause,omitempty"`         // the letter's idem-cause
	Count   int    `json:"redrive_count,omitempty"` // the copy's idem-redrive-count
	Release bool   `json:"release,omitempty"`       // its failed row is released before the send
	// FailedAt is the created time of the failed row Release releases:
	// Execute releases that row, not one recorded since.
	FailedAt time.Time `json:"failed_at,omitzero"`
}

// planned is the verdict the planner gave e.
func (e Entry) planned() string {
	if e.Planned != "" {
		return e.Planned
	}
	return e.Verdict
}

// Digest is a short name of the plan: the first 16 hex digits of the
// SHA-256 of its JSON. Two plans with the same digest do the same.
func (p *Plan) Digest() string {
	b, _ := json.Marshal(p)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Counts returns the number of entries per verdict.
func (p *Plan) Counts() map[string]int {
	out := map[string]int{}
	for _, e := range p.Entries {
		out[e.Verdict]++
	}
	return out
}

// SkipLetter marks a letter the planner would send or stop at as skipped by the
// operator: the run commits past it and sends nothing.
func (p *Plan) SkipLetter(letter string) error {
	for i := range p.Entries {
		e := &p.Entries[i]
		if e.Letter != letter {
			continue
		}
		switch e.Verdict {
		case VerdictSkip, VerdictDuplicate:
			return nil
		}
		e.Planned, e.Verdict = e.planned(), VerdictSkip
		if e.Reason == "" {
			e.Reason = "skipped by the operator"
		} else {
			e.Reason = "skipped by the operator: " + e.Reason
		}
		return nil
	}
	return fmt.Errorf("redrive: letter %s is not in the plan", letter)
}

// Hold takes a letter and the letters after it in its queue out of the
// plan: its queue stops before it, and the next run starts with it.
func (p *Plan) Hold(letter string) error {
	at := -1
	for i, e := range p.Entries {
		if e.Letter == letter {
			at = i
			break
		}
	}
	if at < 0 {
		return fmt.Errorf("redrive: letter %s is not in the plan", letter)
	}
	q := p.Entries[at].Queue
	kept := p.Entries[:at:at]
	for _, e := range p.Entries[at:] {
		if e.Queue != q {
			kept = append(kept, e)
		}
	}
	p.Entries = kept
	return nil
}

// check says what is wrong with a plan that was not made by Prepare, or
// was changed other than by SkipLetter and Hold: a verdict changed to
// anything but a skip, letters out of order or after a stop.
func (p *Plan) check() error {
	switch {
	case p == nil:
		return errors.New("redrive: no plan")
	case p.Topic == "" || p.Group == "" || p.Broker == "":
		return errors.New("redrive: the plan names no broker, topic or group")
	case p.MaxRedrives <= 0:
		return fmt.Errorf("redrive: the plan's max_redrives %d is not positive", p.MaxRedrives)
	}
	last := map[string]int64{}
	stopped := map[string]bool{}
	for _, e := range p.Entries {
		switch e.Verdict {
		case VerdictSend, VerdictDuplicate, VerdictSkip, VerdictStop:
		default:
			return fmt.Errorf("redrive: letter %s: unknown verdict %q", e.Letter, e.Verdict)
		}
		// The operator may only take letters out (SkipLetter, Hold): a
		// verdict that differs from the planner's is a skip, and Execute
		// checks the planner's (Planned) against a fresh plan.
		if e.Planned != "" && e.Verdict != VerdictSkip {
			return fmt.Errorf("redrive: letter %s: verdict %q over the planner's %q: an operator may only skip a letter, "+
				"not send one the planner did not", e.Letter, e.Verdict, e.Planned)
		}
		if stopped[e.Queue] {
			return fmt.Errorf("redrive: letter %s follows a stop in its queue %s", e.Letter, e.Queue)
		}
		if o, ok := last[e.Queue]; ok && e.Offset <= o {
			return fmt.Errorf("redrive: letter %s is not after letter %d of its queue %s", e.Letter, o, e.Queue)
		}
		last[e.Queue], stopped[e.Queue] = e.Offset, e.Verdict == VerdictStop
	}
	return nil
}

// StaleError is Execute's refusal of a plan that no longer says what a
// redrive would do: nothing was sent, released or committed.
type StaleError struct {
	Letter string // the first letter that differs, or the queue
	Shown  string // what the plan says of it
	Now    string // what a plan made now says
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("stale plan: %s: shown %s, now %s; nothing was done: make a new plan (--dry-run)", e.Letter, e.Shown, e.Now)
}

// describe is an entry as StaleError shows it.
func describe(e *Entry) string {
	if e == nil {
		return "not there"
	}
	s := e.planned()
	if e.Key != "" {
		s += " of key " + e.Scope + "/" + e.Key
	}
	if e.Release {
		s += " (its failed row of " + e.FailedAt.UTC().Format(time.RFC3339Nano) + " released on the way)"
	}
	if e.Reason != "" && e.Verdict != VerdictSend {
		s += " (" + e.Reason + ")"
	}
	return s
}

// same reports whether a fresh entry says what the shown one said.
func same(shown, fresh Entry) bool {
	return shown.Letter == fresh.Letter && shown.Queue == fresh.Queue && shown.Offset == fresh.Offset &&
		shown.Scope == fresh.Scope && shown.Key == fresh.Key && shown.To == fresh.To &&
		shown.planned() == fresh.Verdict && shown.Release == fresh.Release && shown.FailedAt.Equal(fresh.FailedAt) &&
		shown.Count == fresh.Count
}
