package seams_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
)

// The entity dimension (issue 40): with Config.Entity each payment is an
// event of one of a few accounts (its entity) at a version drawn from a
// small range, so that the stream has late events (below a version
// applied), equal versions (another payment at an applied version) and
// re-sends (the resend op). The checks: an entity's applied versions rise
// in commit order (no stale event applied, no watermark going back), and
// a payment never applied nor dead-lettered is stale — below or at a
// version its entity applied, and recorded by the store; with
// StaleDeadLetter, a letter of cause stale names a watermark its entity
// applied.
//
// Its status variant versions as a payment channel does (dedup.StatusRank):
// the payload carries a time and a status instead of a sequence, and the
// version is Version{Major: time, Minor: rank}. Sequence v is time
// (v+1)/2 at status opened (v odd) or settled (v even): the same order,
// with ties on the time broken by the rank.

// entityConfig is the dimension's draw.
type entityConfig struct {
	on     bool
	stale  consumer.StalePolicy
	status bool // the status variant: time and status's rank
}

// paymentStatus is the status variant's machine.
var paymentStatus = dedup.StatusRank("opened", "settled")

// statusOf is sequence v as the status variant's payload spells it.
func statusOf(v int64) (at int64, status string) {
	return (v + 1) / 2, paymentStatus.States()[(v+1)%2]
}

// versionOf is the version Config.Entity gives sequence v.
func (e entityConfig) versionOf(v int64) dedup.Version {
	if !e.status {
		return dedup.Version{Major: v}
	}
	at, st := statusOf(v)
	ver, err := paymentStatus.At(at, st)
	if err != nil {
		panic(err)
	}
	return ver
}

// drawEntity draws the dimension; a rng of its own keeps the other
// dimensions of a seed as they were.
func drawEntity(rng *rand.Rand) entityConfig {
	if rng.IntN(2) == 0 {
		return entityConfig{}
	}
	return entityConfig{on: true, stale: consumer.StalePolicy(rng.IntN(2)), status: rng.IntN(2) == 0}
}

func (e entityConfig) String() string {
	switch {
	case !e.on:
		return ""
	case e.status && e.stale == consumer.StaleDeadLetter:
		return " entity=status stale=DeadLetter"
	case e.status:
		return " entity=status stale=Skip"
	case e.stale == consumer.StaleDeadLetter:
		return " entity stale=DeadLetter"
	}
	return " entity stale=Skip"
}

const (
	// checkEntityOrder: the versions an entity applied rise in commit
	// order: no stale event is applied, no watermark goes back.
	checkEntityOrder = "entity-order"
	// checkEntityStale: a payment neither applied nor dead-lettered is a
	// stale event, recorded by the store; a letter of cause stale names
	// the event's version and a watermark at or above it that its entity
	// applied.
	checkEntityStale = "entity-stale"
)

// entities is how many accounts the payments are events of: few, so that
// their versions collide.
const entities = 3

// entityOf is pay's account and version, from the seed: a version in
// 1..6, so that later payments are often late or equal.
func entityOf(seed uint64, pay string) (string, int64) {
	h := fnv.New64a()
	h.Write([]byte(strconv.FormatUint(seed, 10) + "/" + pay))
	x := h.Sum64()
	return fmt.Sprintf("acct-%d", x%entities), int64((x/entities)%6) + 1
}

// entityFunc is Config.Entity: the account and version the payload
// carries, the account under the topic's name when the tenant is the
// topic (a copy is ordered as its original: the consumer shows the
// function the original, and a copy carries its entity).
func (c config) entityFunc() func(m *consumer.Message) (consumer.Entity, error) {
	if !c.entity.on {
		return nil
	}
	return func(m *consumer.Message) (consumer.Entity, error) {
		var pl payload
		if err := json.Unmarshal(m.Value, &pl); err != nil || pl.Ent == "" {
			return consumer.Entity{}, fmt.Errorf("no account in %q: %v", m.Value, err)
		}
		name := pl.Ent
		if c.tenant == "topic" {
			name = m.Topic + ":" + name
		}
		if c.entity.status {
			v, err := paymentStatus.At(pl.At, pl.Status)
			return consumer.Entity{Name: name, Version: v}, err
		}
		return consumer.Entity{Name: name, Version: dedup.Version{Major: pl.Ver}}, nil
	}
}

// entityRows returns, per account, the versions applied in commit order
// (the business rows' order: an entity's next transaction waits for the
// one before it, and takes its row's ID after).
func (r *kafkaRunner) entityRows(ctx context.Context) map[string][]int64 {
	out, err := r.entityRowsErr(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// entityRowsErr is entityRows for a goroutine other than the test's (a
// dead-letter sink's): it returns its error.
func (r *kafkaRunner) entityRowsErr(ctx context.Context) (map[string][]int64, error) {
	out := map[string][]int64{}
	res, err := r.pool.Query(ctx, `SELECT ent, ver FROM `+r.table+` WHERE ent <> '' ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer res.Close()
	for res.Next() {
		var ent string
		var ver int64
		if err := res.Scan(&ent, &ver); err != nil {
			return nil, err
		}
		out[ent] = append(out[ent], ver)
	}
	return out, res.Err()
}

// staleNow reports whether p, not applied, is stale against what its
// entity applied: a version at or above p's.
func staleNow(applied map[string][]int64, p *kpay) bool {
	for _, v := range applied[p.ent] {
		if v >= p.ver {
			return true
		}
	}
	return false
}

// checkEntities checks that each entity's applied versions rise.
func (r *kafkaRunner) checkEntities(applied map[string][]int64) {
	for ent, vs := range applied {
		for i := 1; i < len(vs); i++ {
			if vs[i] <= vs[i-1] {
				r.rep.violation(checkEntityOrder, ent, "account %s: version %d applied after %d (versions in commit order: %v)", ent, vs[i], vs[i-1], vs)
				break
			}
		}
	}
}

// checkStaleRecorded checks that p, neither applied nor dead-lettered at
// the end, is stale and recorded by the store.
func (r *kafkaRunner) checkStaleRecorded(ctx context.Context, applied map[string][]int64, p *kpay) bool {
	if !staleNow(applied, p) {
		return false
	}
	evs, err := r.pg.StaleEvents(ctx, dedup.StaleFilter{Limit: 10000})
	if err != nil {
		r.t.Fatal(err)
	}
	for _, e := range evs {
		if e.Version == r.cfg.entity.versionOf(p.ver) && (e.Entity == p.ent || e.Entity == r.topic+":"+p.ent) && (!r.cfg.business() || e.Key.ID == p.id || r.cfg.key == "composite") {
			r.counts["stale, recorded"]++
			return true
		}
	}
	r.rep.violation(checkEntityStale, p.id, "payment %s (%s v%d) neither applied nor dead-lettered, and no stale event of it is recorded (%d recorded)", p.id, p.ent, p.ver, len(evs))
	return true
}

// checkStaleLetter checks a letter of cause stale.
func (r *kafkaRunner) checkStaleLetter(ctx context.Context, l consumer.Letter) {
	var pl payload
	_ = json.Unmarshal(l.Message.Value, &pl)
	if !errors.Is(l.Reason, consumer.ErrStale) || l.Entity.Version != r.cfg.entity.versionOf(pl.Ver) || l.Watermark.Compare(l.Entity.Version) < 0 {
		r.rep.violation(checkEntityStale, pl.Pay, "payment %s: stale letter of %s v%d with entity %v, watermark %v, reason %v", pl.Pay, pl.Ent, pl.Ver, l.Entity, l.Watermark, l.Reason)
		return
	}
	rows, err := r.entityRowsErr(ctx)
	if err != nil {
		// In the consumer's goroutine: no t.Fatal here.
		r.rep.violation(checkEntityStale, pl.Pay, "payment %s: the applied versions of %s could not be read: %v", pl.Pay, pl.Ent, err)
		return
	}
	for _, v := range rows[pl.Ent] {
		if r.cfg.entity.versionOf(v) == l.Watermark {
			return
		}
	}
	r.rep.violation(checkEntityStale, pl.Pay, "payment %s: stale letter names watermark %v, which account %s never applied", pl.Pay, l.Watermark, pl.Ent)
}
