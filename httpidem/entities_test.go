package httpidem_test

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// tradeStatus is Alipay's trade_status as a status machine.
var tradeStatus = dedup.StatusRank("WAIT_BUYER_PAY", "TRADE_SUCCESS", "TRADE_FINISHED", "TRADE_CLOSED")

// callback is a payment channel's notice about a trade, as the tests post
// it: the time of the event and the trade's status.
type callback struct {
	Trade  string `json:"trade_no"`
	Status string `json:"trade_status"`
	At     int64  `json:"at"`
}

// newCallbackRoute is a payment callback route on real Postgres whose
// handler writes the trade's status with no guard of its own: only the
// entity step keeps the trade from going back. Every application is logged
// in commit order (applied.seq). row queries the tables by their names.
func newCallbackRoute(t *testing.T) (*pgstore.Store, http.Handler, func(q string, args ...any) pgx.Row) {
	t.Helper()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	store := pgtest.Store(t, pool, schema)
	ctx := testenv.Context(t, time.Minute)
	trades := pgx.Identifier{schema, "trades"}.Sanitize()
	applied := pgx.Identifier{schema, "applied"}.Sanitize()
	for _, q := range []string{
		`CREATE TABLE ` + trades + ` (trade TEXT PRIMARY KEY, status TEXT NOT NULL, at BIGINT NOT NULL)`,
		`CREATE TABLE ` + applied + ` (seq BIGSERIAL PRIMARY KEY, trade TEXT NOT NULL, status TEXT NOT NULL, at BIGINT NOT NULL)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	m, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	srv := m.Transactional(httpidem.Route{
		Name: "/callbacks/alipay",
		Entity: func(_ *http.Request, body []byte) (httpidem.Entity, error) {
			var c callback
			if err := json.Unmarshal(body, &c); err != nil {
				return httpidem.Entity{}, err
			}
			v, err := tradeStatus.At(c.At, c.Status)
			return httpidem.Entity{Name: c.Trade, Version: v}, err
		},
	}, httpidem.TxHandlerFunc[pgx.Tx](func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		var c callback
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			return err
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+trades+` (trade, status, at) VALUES ($1, $2, $3)
ON CONFLICT (trade) DO UPDATE SET status = excluded.status, at = excluded.at`, c.Trade, c.Status, c.At); err != nil {
			return err
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+applied+` (trade, status, at) VALUES ($1, $2, $3)`, c.Trade, c.Status, c.At); err != nil {
			return err
		}
		_, err := io.WriteString(w, "success")
		return err
	}))
	row := func(q string, args ...any) pgx.Row {
		q = strings.NewReplacer("trades", trades, "applied", applied).Replace(q)
		return pool.QueryRow(ctx, q, args...)
	}
	return store, srv, row
}

func postCallback(srv http.Handler, key string, c callback) *httptest.ResponseRecorder {
	body, _ := json.Marshal(c)
	r := httptest.NewRequest(http.MethodPost, "/callbacks/alipay", strings.NewReader(string(body)))
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	return w
}

// TestRouteEntityLateCallbackIsStale (issue 40, seam 40.41): a payment
// route with Route.Entity on real Postgres. The trade is closed; the
// payment's callback, re-sent under a key of its own, arrives after: it is
// answered 200 with Idempotent-Stale (so the channel stops re-sending),
// its handler does not run, the trade stays closed, the store records the
// stale request, and a retry of its key replays the stale answer. Two
// callbacks of one second order by status. An unknown status is 400 and
// claims nothing.
func TestRouteEntityLateCallbackIsStale(t *testing.T) {
	store, srv, row := newCallbackRoute(t)
	status := func() (s string) {
		t.Helper()
		if err := row(`SELECT status FROM trades WHERE trade = 'T1'`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	applications := func() (n int) {
		t.Helper()
		if err := row(`SELECT count(*) FROM applied WHERE trade = 'T1'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	if w := postCallback(srv, "n1", callback{"T1", "TRADE_SUCCESS", 100}); w.Code != 200 || w.Body.String() != "success" {
		t.Fatalf("payment: %d %q", w.Code, w.Body)
	}
	if w := postCallback(srv, "n2", callback{"T1", "TRADE_CLOSED", 200}); w.Code != 200 || w.Body.String() != "success" {
		t.Fatalf("refund: %d %q", w.Code, w.Body)
	}
	late := postCallback(srv, "n3", callback{"T1", "TRADE_SUCCESS", 100}) // the payment, re-sent a day later
	if late.Code != 200 || late.Header().Get("Idempotent-Stale") != "true" {
		t.Fatalf("late payment: %d %v %q, want 200 with Idempotent-Stale: true", late.Code, late.Header(), late.Body)
	}
	if want := `{"stale":true,"entity":"T1","version":"100.2","watermark":"200.4"}`; late.Body.String() != want {
		t.Fatalf("late payment's body %s, want %s", late.Body, want)
	}
	if got := status(); got != "TRADE_CLOSED" {
		t.Fatalf("after a late payment the trade is %s, want TRADE_CLOSED", got)
	}
	if n := applications(); n != 2 {
		t.Fatalf("%d applications, want 2: the stale callback's handler ran", n)
	}
	again := postCallback(srv, "n3", callback{"T1", "TRADE_SUCCESS", 100})
	if again.Header().Get("Idempotent-Replayed") != "true" || again.Header().Get("Idempotent-Stale") != "true" || again.Body.String() != late.Body.String() {
		t.Fatalf("retry of the stale key: %d %v %q, want the stale answer replayed", again.Code, again.Header(), again.Body)
	}
	stale, err := store.StaleEvents(testenv.Context(t, time.Minute), dedup.StaleFilter{Entity: "T1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || stale[0].Key.ID != "n3" || stale[0].Key.Scope != httpidem.Scope("POST", "/callbacks/alipay", "") ||
		stale[0].Version != (dedup.Version{Major: 100, Minor: 2}) || stale[0].Watermark != (dedup.Version{Major: 200, Minor: 4}) {
		t.Fatalf("recorded stale events %+v, want n3 at 100.2 under 200.4", stale)
	}

	// One second, two statuses: the later status wins whichever comes last.
	postCallback(srv, "m1", callback{"T2", "TRADE_FINISHED", 300})
	if w := postCallback(srv, "m2", callback{"T2", "TRADE_SUCCESS", 300}); w.Header().Get("Idempotent-Stale") != "true" {
		t.Fatalf("TRADE_SUCCESS after TRADE_FINISHED of one second: %d %v, want stale", w.Code, w.Header())
	}
	var t2 string
	if err := row(`SELECT status FROM trades WHERE trade = 'T2'`).Scan(&t2); err != nil || t2 != "TRADE_FINISHED" {
		t.Fatalf("T2 is %q (%v), want TRADE_FINISHED", t2, err)
	}

	bad := postCallback(srv, "x1", callback{"T1", "TRADE_PENDING", 300})
	if bad.Code != 400 || !strings.Contains(bad.Body.String(), `unknown status \"TRADE_PENDING\"`) || !strings.Contains(bad.Body.String(), "TRADE_CLOSED") {
		t.Fatalf("unknown status: %d %s, want 400 naming it and the known ones", bad.Code, bad.Body)
	}
	if w := postCallback(srv, "x1", callback{"T1", "TRADE_FINISHED", 300}); w.Code != 200 || w.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("the key of a refused callback: %d %v, want it free and run", w.Code, w.Header())
	}
}

// TestRouteEntityConcurrentCallbacks (seam 40.41): 24 callbacks of one
// trade, each a version of its own, posted at once. Each transaction moves
// the watermark under the entity's lock, so the handler runs for an
// increasing run of versions only (the applied log, in commit order, never
// goes back), every other callback is answered stale and recorded, and the
// trade ends in the newest callback's status.
func TestRouteEntityConcurrentCallbacks(t *testing.T) {
	store, srv, row := newCallbackRoute(t)
	const n = 24
	statuses := tradeStatus.States()
	var wg sync.WaitGroup
	start := make(chan struct{})
	codes := make([]*httptest.ResponseRecorder, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			c := callback{"T1", statuses[i%len(statuses)], int64(i / len(statuses))}
			for try := 0; ; try++ {
				w := postCallback(srv, fmt.Sprintf("k%d", i), c)
				if (w.Code == http.StatusServiceUnavailable || w.Code == http.StatusConflict) && try < 50 {
					continue // as a channel does: re-send, same key
				}
				codes[i] = w
				return
			}
		}()
	}
	close(start)
	wg.Wait()
	staleN := 0
	for i, w := range codes {
		if w.Code != 200 {
			t.Fatalf("callback %d: %d %s", i, w.Code, w.Body)
		}
		if w.Header().Get("Idempotent-Stale") == "true" {
			staleN++
		}
	}
	newest := statuses[(n-1)%len(statuses)]
	var status string
	if err := row(`SELECT status FROM trades WHERE trade = 'T1'`).Scan(&status); err != nil || status != newest {
		t.Fatalf("the trade is %q (%v), want %s, the newest callback's", status, err, newest)
	}
	var applied, backwards int
	if err := row(`SELECT count(*), count(*) FILTER (WHERE back) FROM (
    SELECT (at, status_rank) < lag((at, status_rank)) OVER (ORDER BY seq) AS back FROM (
        SELECT seq, at, array_position($1::text[], status) AS status_rank FROM applied) r) s`, statuses).Scan(&applied, &backwards); err != nil {
		t.Fatal(err)
	}
	if backwards != 0 {
		t.Fatalf("%d of %d applications went back in version", backwards, applied)
	}
	if applied+staleN != n {
		t.Fatalf("%d applied + %d stale != %d callbacks", applied, staleN, n)
	}
	recorded, err := store.StaleEvents(testenv.Context(t, time.Minute), dedup.StaleFilter{Entity: "T1", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(recorded) != staleN {
		t.Fatalf("%d stale events recorded, %d answered stale", len(recorded), staleN)
	}
	t.Logf("%d applied, %d stale", applied, staleN)
}

// TestRouteEntityNeedsTransactionalKeyedRouteAndWatermarks: the
// configurations Entity cannot keep its promise in are refused, naming the
// field.
func TestRouteEntityNeedsTransactionalKeyedRouteAndWatermarks(t *testing.T) {
	m := sqliteMiddleware(t)
	ent := func(*http.Request, []byte) (httpidem.Entity, error) { return httpidem.Entity{}, nil }
	h := httpidem.TxHandlerFunc[*sql.Tx](func(http.ResponseWriter, *http.Request, *sql.Tx) error { return nil })
	for name, tc := range map[string]struct {
		run  func()
		want string
	}{
		"leased":           {func() { m.Leased(httpidem.Route{Name: "/a", Entity: ent}) }, "Entity is for Transactional routes"},
		"optional":         {func() { m.Transactional(httpidem.Route{Name: "/a", Entity: ent, Optional: true}, h) }, "Entity needs a key"},
		"stale, no entity": {func() { m.Transactional(httpidem.Route{Name: "/a", Stale: httpidem.AnswerStale}, h) }, "Stale is set without Entity"},
	} {
		func() {
			defer func() {
				v := recover()
				err, _ := v.(error)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: panic %v, want %q", name, v, tc.want)
				}
			}()
			tc.run()
		}()
	}
}
