package outbox

import (
	"context"
	"fmt"
	"time"
)

// PendingStats are the outbox's rows not published yet.
type PendingStats struct {
	Count int64
	// Oldest is when the oldest pending row was enqueued (Postgres' clock),
	// and OldestAge how long before the query that was; both zero when
	// nothing is pending. An age that keeps growing is a relay that does
	// not run, or a shard that cannot publish.
	Oldest    time.Time
	OldestAge time.Duration
}

// Pending counts the rows waiting to be published, and how old the oldest
// is: one aggregate over the pending rows (a partial index of them).
func (o *Outbox) Pending(ctx context.Context) (PendingStats, error) {
	var p PendingStats
	var oldest *time.Time
	var ageMs *int64
	err := o.pool.QueryRow(ctx, `SELECT count(*), min(created_at),
    (extract(epoch FROM now() - min(created_at)) * 1000)::bigint
FROM `+o.table+` WHERE sent_at IS NULL`).Scan(&p.Count, &oldest, &ageMs)
	if err != nil {
		return PendingStats{}, fmt.Errorf("outbox: pending: %w", err)
	}
	if oldest != nil {
		p.Oldest = *oldest
	}
	if ageMs != nil {
		p.OldestAge = max(time.Duration(*ageMs)*time.Millisecond, 0)
	}
	return p, nil
}
