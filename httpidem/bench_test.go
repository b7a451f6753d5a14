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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/testenv"
)

// BenchmarkTransactional is one endpoint that inserts one row, on the test
// environment's Postgres, bare (its own BEGIN, INSERT, COMMIT) and behind
// the middleware in transactional mode (claim, INSERT, stored response,
// COMMIT), in the same run. Every request has a new key. Requests go to
// ServeHTTP from parallel goroutines (no network between client and
// handler, so the middleware's share is not diluted by HTTP's); req/s is
// the throughput, compare the two rows.
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
	run := func(name string, h http.Handler) {
		b.Run(name, func(b *testing.B) {
			b.SetParallelism(4) // 4 × GOMAXPROCS request goroutines
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := fmt.Sprintf("%s-%d", name, seq.Add(1))
					r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100,"currency":"EUR"}`))
					r.Header.Set("Idempotency-Key", id)
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					if w.Code != http.StatusCreated {
						b.Errorf("%s: %d %s", name, w.Code, w.Body)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
	run("bare", bare)
	run("idem", idem)
	// The same over loopback HTTP: a server, a keep-alive client.
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
					id := fmt.Sprintf("%s-%d", name, seq.Add(1))
					r, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100,"currency":"EUR"}`))
					r.Header.Set("Idempotency-Key", id)
					res, err := client.Do(r)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, res.Body)
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
	_ = (*pgxpool.Pool)(nil)
}
