package seams_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
)

// maxRedrives is `idem redrive`'s default --max-redrives.
const maxRedrives = 5

// redrive fixes pay's cause and redrives one of its dead letters.
func (r *runner) redrive(ctx context.Context, pay string, pick int) {
	p := r.mo.pays[pay]
	r.fix(p)
	recs := map[recID]string{}
	for _, rec := range r.b.records() {
		recs[rec.id] = rec.pay
	}
	var mine []*letter
	for _, l := range r.dlq.all() {
		if recs[l.from] == pay {
			mine = append(mine, l)
		}
	}
	if len(mine) == 0 {
		r.mo.count("redrives without a letter yet")
		return
	}
	action, reason := r.redriveLetter(ctx, mine[pick%len(mine)])
	if action == "sent" {
		p.copies++
		r.mo.count("redrives sent")
	} else {
		r.mo.count("redrives refused (" + reason + ")")
	}
}

// redriveLetter does with one letter what `idem redrive --release` does
// (redriveRecord), sending the copy to the original partition of the
// simulated broker.
func (r *runner) redriveLetter(ctx context.Context, l *letter) (action, reason string) {
	headers, part, reason := redriveRecord(ctx, r.t, r.pg, l, topic)
	if reason != "" {
		return "refused", reason
	}
	pay := ""
	for _, rec := range r.b.records() {
		if rec.id == l.from {
			pay = rec.pay
		}
	}
	r.b.append(int32(part), l.key, l.value, headers, pay, true)
	return "sent", ""
}

// redriveRecord does with one letter of topic's dead-letter topic what
// `idem redrive --release` does (cmd/idem/redrive.go, redriver.letter):
// refuse a letter that is not idem's, has no key, was redriven
// --max-redrives times, or whose key is done (reason says why); release
// the key's failed row; and return the headers of the copy to send back
// to the original partition part — a new offset —: the letter's headers
// (the message's own, its original coordinates and key) less the
// letter's own, and the lineage: idem-redrive-count, idem-redriven-from.
func redriveRecord(ctx context.Context, t testing.TB, pg *pgstore.Store, l *letter, topic string) (headers []consumer.Header, part int, reason string) {
	hdr := func(k string) (string, bool) {
		for _, h := range l.headers {
			if h.Key == k {
				return string(h.Value), true
			}
		}
		return "", false
	}
	scope, _ := hdr(wire.MetaKeyScope)
	key, _ := hdr(wire.MetaKey)
	to, _ := hdr(wire.MetaTopic)
	partition, _ := hdr(wire.MetaPartition)
	part, perr := strconv.Atoi(partition)
	count := 0
	if c, ok := hdr(wire.MetaRedriveCount); ok {
		count, _ = strconv.Atoi(c)
	}
	switch {
	case to != topic:
		return nil, 0, "no " + wire.MetaTopic
	case perr != nil:
		return nil, 0, "no " + wire.MetaPartition
	case scope == "" || key == "":
		return nil, 0, "no key"
	case count >= maxRedrives:
		return nil, 0, "max redrives"
	}
	rows, err := pg.Admin().Find(ctx, scope, key)
	if err != nil {
		t.Fatalf("redrive: find %s/%s: %v", scope, key, err)
	}
	for _, row := range rows {
		switch row.Outcome {
		case "done":
			return nil, 0, "the key was applied"
		case "failed":
			if _, err := pg.Admin().Release(ctx, []dedup.Key{row.Key}, false); err != nil {
				t.Fatalf("redrive: release: %v", err)
			}
		}
	}
	for _, h := range l.headers {
		switch h.Key {
		case wire.MetaReason, wire.MetaAttempts, wire.MetaAttempt, wire.MetaLane,
			wire.MetaRedriveCount, wire.MetaRedrivenFrom:
		default:
			headers = append(headers, h)
		}
	}
	headers = append(headers,
		consumer.Header{Key: wire.MetaRedriveCount, Value: []byte(strconv.Itoa(count + 1))},
		consumer.Header{Key: wire.MetaRedrivenFrom, Value: []byte(fmt.Sprintf("%s.dlq/%d/%d", topic, l.at.part, l.at.off))})
	return headers, part, ""
}
