package seams_test

import (
	"context"
	"fmt"
	"strconv"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
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
// (cmd/idem/redrive.go, redriver.letter): refuse a letter that is not
// idem's, has no key, was redriven --max-redrives times, or whose key is
// done; release the key's failed row; send the value back to the original
// partition — a new offset — with the letter's headers (the message's own,
// its original coordinates and key) less the letter's own, and the lineage:
// idem-redrive-count, idem-redriven-from.
func (r *runner) redriveLetter(ctx context.Context, l *letter) (action, reason string) {
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
		return "refused", "no " + wire.MetaTopic
	case perr != nil:
		return "refused", "no " + wire.MetaPartition
	case scope == "" || key == "":
		return "refused", "no key"
	case count >= maxRedrives:
		return "refused", "max redrives"
	}
	rows, err := r.pg.Admin().Find(ctx, scope, key)
	if err != nil {
		r.t.Fatalf("redrive: find %s/%s: %v", scope, key, err)
	}
	for _, row := range rows {
		switch row.Outcome {
		case "done":
			return "refused", "the key was applied"
		case "failed":
			if _, err := r.pg.Admin().Release(ctx, []dedup.Key{row.Key}, false); err != nil {
				r.t.Fatalf("redrive: release: %v", err)
			}
		}
	}
	var headers []consumer.Header
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
	pay := ""
	for _, rec := range r.b.records() {
		if rec.id == l.from {
			pay = rec.pay
		}
	}
	r.b.append(int32(part), l.key, l.value, headers, pay, true)
	return "sent", ""
}
