package channels_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
)

// certFetch stands for a verifier's fetch of the channel's rotating
// platform certificate (Alipay's certificate mode, WeChat Pay's platform
// certificates): it fails until more than minFails fetches failed and
// minOutage passed since the first.
type certFetch struct {
	minFails  int
	minOutage time.Duration

	mu    sync.Mutex
	fails int
	since time.Time
}

var errCertAway = errors.New("fetch platform certificate: connection refused")

func (c *certFetch) fetch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.since.IsZero() {
		c.since = time.Now()
	}
	if c.fails > c.minFails && time.Since(c.since) > c.minOutage {
		return nil
	}
	c.fails++
	return errCertAway
}

// TestCertificateOutageDelaysNoNotice: while the verifier cannot fetch the
// channel's certificate, Validate says so with consumer.Retryable, and the
// lanes wait — through more than a hundred failed fetches and far beyond
// the retry budget (MaxElapsed 100ms, 3 attempts) — then every notice is
// judged as usual: each genuine event applied once, nothing dead-lettered
// but the forgeries, the tables reconciled.
func TestCertificateOutageDelaysNoNotice(t *testing.T) {
	for _, ch := range channelsUnderTest() {
		t.Run(ch.Name(), func(t *testing.T) {
			t.Parallel()
			f := load(t, ch.Name())
			cert := &certFetch{minFails: 100, minOutage: time.Second}
			r := consume(t, ch, f, func(c *consumer.Config[pgx.Tx]) {
				verify := c.Validate
				c.Validate = func(ctx context.Context, m *consumer.Message) error {
					if err := cert.fetch(); err != nil {
						return consumer.Retryable(err)
					}
					return verify(ctx, m)
				}
				c.Retry = consumer.RetryPolicy{Initial: time.Millisecond, Max: 10 * time.Millisecond, MaxAttempts: 3, MaxElapsed: 100 * time.Millisecond}
			})
			t.Logf("%d failed certificate fetches; %v", cert.fails, r.report)
			if cert.fails <= cert.minFails {
				t.Errorf("%d failed fetches, want more than %d", cert.fails, cert.minFails)
			}
			if !r.report.OK() {
				t.Error(r.report)
			}
			r.check(t, f, false)
			for line, l := range r.seen.letters {
				if errors.Is(l.Reason, errCertAway) {
					t.Errorf("line %d dead-lettered over the outage: %v", line, l.Reason)
				}
			}
		})
	}
}
