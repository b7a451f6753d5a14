package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/sqlitestore"
)

// ageHistogram is what consumer/otelconsumer's duplicate-age histogram looks
// like on /metrics: counts per bucket bound (cumulative, as Prometheus has
// them), for one consumer and one partition.
func ageHistogram(name, partition string, cumulative map[string]int) string {
	return histogram(ageMetric, fmt.Sprintf(`idem_consumer_name=%q,messaging_destination_partition_id=%q`, name, partition), cumulative)
}

// histogram is an age histogram of idem's buckets as /metrics has it: the
// series of metric with labels, counts per bucket bound (cumulative).
func histogram(metric, labels string, cumulative map[string]int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# TYPE %s histogram\n", metric)
	for _, le := range []string{"1", "10", "60", "600", "3600", "21600", "86400", "604800", "2.592e+06", "7.776e+06", "+Inf"} {
		fmt.Fprintf(&b, "%s_bucket{%s,le=%q} %d\n", metric, labels, le, cumulative[le])
	}
	fmt.Fprintf(&b, "%s_sum{%s} 1\n%s_count{%s} %d\n", metric, labels, metric, labels, cumulative["+Inf"])
	return b.String()
}

// TestRetentionFromMetrics: a scope kept an hour whose duplicates arrive
// up to six hours late is too short; a scope kept for ever is fine.
func TestRetentionFromMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := sqlitestore.Open(path, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := sqlitestore.New(db, sqlitestore.Config{ScopeRetention: map[string]time.Duration{"hourly": time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, scope := range []string{"hourly", "payments"} {
		c := dedup.Claim{Key: dedup.Key{Scope: scope, ID: "k"}, Fingerprint: dedup.FingerprintOf([]byte("k"))}
		if err := st.RecordFailure(ctx, c, "x"); err != nil {
			t.Fatal(err)
		}
	}
	late := map[string]int{"1": 10, "10": 10, "60": 10, "600": 10, "3600": 10, "21600": 1000, "86400": 1000, "604800": 1000, "2.592e+06": 1000, "7.776e+06": 1000, "+Inf": 1000}
	body := ageHistogram("hourly", "0", late) + strings.TrimPrefix(ageHistogram("payments", "0", late), "# TYPE "+ageMetric+" histogram\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) }))
	defer srv.Close()

	envs := map[string]string{"IDEM_SQLITE": path}
	code, out, _ := idem(t, "", envs, "retention", "--metrics", srv.URL, "--json")
	res := decode[[]retentionJSON](t, out)
	if code != exitPartial || len(res) != 2 {
		t.Fatalf("retention: %d %+v", code, res)
	}
	if r := res[0]; r.Scope != "hourly" || r.Advice != "too_short" || r.P999Sec != 21600 || r.Duplicates != 1000 || r.RetentionSec != 3600 {
		t.Errorf("hourly: %+v", r)
	}
	if r := res[1]; r.Scope != "payments" || r.Advice != "ok" || !r.Forever {
		t.Errorf("payments: %+v", r)
	}
	if code, out, _ := idem(t, "", envs, "retention", "--metrics", srv.URL); code != exitPartial || !strings.Contains(out, "keep keys at least 12h") {
		t.Errorf("retention: %d %q", code, out)
	}
}

// TestParseAgesOneInfBucket: the text format's le="+Inf" bucket is not
// counted as a bucket of its own besides the one from the sample count.
func TestParseAgesOneInfBucket(t *testing.T) {
	got, err := parseScrape(strings.NewReader(ageHistogram("pay", "0", map[string]int{"+Inf": 5})))
	if err != nil {
		t.Fatal(err)
	}
	a := got.consumers["pay"]
	if n := len(a.bounds); n != 11 || !math.IsInf(a.bounds[n-1], 1) || math.IsInf(a.bounds[n-2], 1) || a.total() != 5 {
		t.Errorf("bounds %v, counts %v", a.bounds, a.counts)
	}
}
