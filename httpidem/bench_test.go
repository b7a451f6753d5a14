package httpidem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/testenv"
)

// BenchmarkTransactional is one endpoint that inserts one row, on the
// Postgres of IDEM_TEST_PG_URL (point it at scripts/testenv.sh's
// postgres-durable cluster to measure with fsync on), bare — its own
// BEGIN, INSERT, COMMIT — and behind the middleware in transactional mode,
// in the same run. Every request has a new key.
//
//   - bare, idem: throughput of 4×GOMAXPROCS goroutines calling ServeHTTP
//     (no network between client and handler);
//   - http-bare, http-idem: the same through a loopback HTTP server and a
//     keep-alive client;
//   - alternating: one goroutine sending a bare and an idem request in
//     turn, so that both meet the same load on a shared machine; reports
//     each one's mean latency and their ratio (bare/idem: idem's
//     throughput as a share of bare's, for one client).
func BenchmarkTransactional(b *testing.B) {
	pool := testenv.Pool(b)
	schema := testenv.Schema(b, pool)
	ctx := context.Background()
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	table := pgx.Identifier{schema, "payments"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	insert := `INSERT INTO ` + table + ` (id, amount) VALUES ($1, $2)`
	respond := func(w http.ResponseWriter, id string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"status":"paid"}`, id)
	}
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Idempotency-Key")
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), insert, id, 100)
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		respond(w, id)
	})
	m, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	idem := m.Transactional(httpidem.Route{Name: "/payments"}, httpidem.TxHandlerFunc[pgx.Tx](
		func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			id := r.Header.Get("Idempotency-Key")
			if _, err := tx.Exec(r.Context(), insert, id, 100); err != nil {
				return err
			}
			respond(w, id)
			return nil
		}))
	var seq atomic.Int64
	request := func(b *testing.B, h http.Handler, kind string) {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100,"currency":"EUR"}`))
		r.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", kind, seq.Add(1)))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("%s: %d %s", kind, w.Code, w.Body)
		}
	}
	parallel := func(name string, h http.Handler) {
		b.Run(name, func(b *testing.B) {
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					request(b, h, name)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
	parallel("bare", bare)
	parallel("idem", idem)
	overHTTP := func(name string, h http.Handler) {
		b.Run(name, func(b *testing.B) {
			srv := httptest.NewServer(h)
			defer srv.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: 64}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100,"currency":"EUR"}`))
					if err != nil {
						b.Error(err)
						return
					}
					r.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", name, seq.Add(1)))
					res, err := client.Do(r)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != http.StatusCreated {
						b.Errorf("%s: %d", name, res.StatusCode)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
	overHTTP("http-bare", bare)
	overHTTP("http-idem", idem)
	b.Run("alternating", func(b *testing.B) {
		var tb, ti time.Duration
		for range b.N {
			t0 := time.Now()
			request(b, bare, "alt-bare")
			t1 := time.Now()
			request(b, idem, "alt-idem")
			tb, ti = tb+t1.Sub(t0), ti+time.Since(t1)
		}
		b.ReportMetric(float64(tb.Microseconds())/float64(b.N), "bare-µs/req")
		b.ReportMetric(float64(ti.Microseconds())/float64(b.N), "idem-µs/req")
		b.ReportMetric(float64(tb)/float64(ti), "idem/bare")
	})
}
