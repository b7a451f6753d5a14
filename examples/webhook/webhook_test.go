package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.ChildMain(childEnv, runChild) // TestPayoutTakeoverAfterSIGKILL's child
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.DiscardHandler)

// backend is the webhook on one database, with its bank on a test server.
type backend struct {
	handler http.Handler
	db      payments.DB // outside the webhook, for reconciling
	dedup   string      // the dedup table as SQL names it
	bank    *Bank
	store   requestAdmin
	// drop breaks the connection of a transaction (Postgres only).
	drop func(ctx context.Context, tx any) error
}

// newBackend opens the webhook with open, its bank served by a test server.
func newBackend(t *testing.T, opts Options, db payments.DB, open func(Options) (app, error)) backend {
	var bank atomic.Pointer[Bank]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { bank.Load().ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	opts.Bank = srv.URL
	a, err := open(opts)
	if err != nil {
		t.Fatal(err)
	}
	bank.Store(a.bank)
	return backend{handler: a.handler, db: db, dedup: a.table, bank: a.bank, store: a.store}
}

func sqliteBackend(t *testing.T, opts Options) backend {
	db, err := sqliteOpen(t)
	if err != nil {
		t.Fatal(err)
	}
	return newBackend(t, opts, payments.SQL(db), func(o Options) (app, error) { return openSQLite(t.Context(), db, o) })
}

func sqliteOpen(t *testing.T) (*sql.DB, error) {
	db, err := sqliteOpenPath(filepath.Join(t.TempDir(), "webhook.db"))
	if err == nil {
		t.Cleanup(func() { db.Close() })
	}
	return db, err
}

func postgresBackend(t *testing.T, opts Options) backend {
	pool, _ := testenv.SchemaPool(t)
	b := newBackend(t, opts, payments.Pgx(pool), func(o Options) (app, error) { return openPostgres(t.Context(), pool, o) })
	admin := testenv.Pool(t)
	b.drop = func(ctx context.Context, tx any) error {
		_, err := admin.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, tx.(pgx.Tx).Conn().PgConn().PID())
		return err
	}
	return b
}

// eachBackend runs f on SQLite and on Postgres; opts is built per backend
// (its hooks may need the backend).
func eachBackend(t *testing.T, f func(t *testing.T, open func(Options) backend)) {
	t.Run("sqlite", func(t *testing.T) { f(t, func(o Options) backend { return sqliteBackend(t, o) }) })
	t.Run("postgres", func(t *testing.T) { f(t, func(o Options) backend { return postgresBackend(t, o) }) })
}

func callback(txn, order string, amount int64, channel string) string {
	b, _ := json.Marshal(payments.Callback{TxnID: txn, OrderID: order, Amount: amount, Channel: channel, Status: "SUCCESS"})
	return string(b)
}

// post sends a callback; key "" sends none.
func post(h http.Handler, channel, key, body string) *httptest.ResponseRecorder {
	return send(h, "/callbacks/"+channel, key, body, "")
}

// send posts body to target with key and FaultHeader fault ("": none of
// either).
func send(h http.Handler, target, key, body, fault string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	if fault != "" {
		r.Header.Set(FaultHeader, fault)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func replayed(w *httptest.ResponseRecorder) bool {
	return w.Header().Get("Idempotent-Replayed") == "true"
}

func reconcile(t *testing.T, b backend, expected ...payments.Expected) {
	t.Helper()
	r, err := Reconcile(context.Background(), b.db, b.dedup, expected)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || r.Payments != int64(len(expected)) {
		t.Fatalf("%v (%d payments, want %d)", r, r.Payments, len(expected))
	}
}

// gate holds handlers half-way until the test opens it; started says the
// first arrived.
type gate struct {
	started chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{started: make(chan struct{}, 1), open: make(chan struct{})}
	t.Cleanup(g.release)
	return g
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// wait is the gate as Options.Hold: every request that calls it waits.
func (g *gate) wait(ctx context.Context) error {
	select {
	case g.started <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestWebhookAnswers drives the curl lines of docs/http.md for the
// transactional route through the handler: executed, replayed, a changed
// body, a missing key, a concurrent duplicate ("Demo-Fault: slow").
func TestWebhookAnswers(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(Options) backend) {
		g := newGate(t)
		b := open(Options{Logger: quiet, Hold: g.wait})
		pay := callback("4200000001", "O-1001", 2500, "wechat")
		first := post(b.handler, "wechat", "4200000001", pay)
		if first.Code != http.StatusOK || replayed(first) || !strings.Contains(first.Body.String(), `"SUCCESS"`) {
			t.Fatalf("first callback: %d %s", first.Code, first.Body)
		}
		again := post(b.handler, "wechat", "4200000001", pay)
		if again.Code != http.StatusOK || !replayed(again) || again.Body.String() != first.Body.String() {
			t.Fatalf("re-sent callback: %d replayed %v %s; want the first answer replayed", again.Code, replayed(again), again.Body)
		}
		respelled := post(b.handler, "wechat", "4200000001", `{ "status": "SUCCESS", "channel": "wechat", "amount": 2500.0, "order_id": "O-1001", "txn_id": "4200000001" }`)
		if !replayed(respelled) {
			t.Fatalf("the callback reformatted: %d, want a replay", respelled.Code)
		}
		if w := post(b.handler, "wechat", "4200000001", callback("4200000001", "O-1001", 2600, "wechat")); w.Code != http.StatusUnprocessableEntity {
			t.Fatalf("another amount under the key: %d %s, want 422", w.Code, w.Body)
		}
		if w := post(b.handler, "wechat", "", pay); w.Code != http.StatusBadRequest {
			t.Fatalf("no key: %d %s, want 400", w.Code, w.Body)
		}
		// A concurrent duplicate, while the first is booked but not answered.
		second := callback("4200000002", "O-1002", 990, "wechat")
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- send(b.handler, "/callbacks/wechat", "4200000002", second, "slow") }()
		<-g.started
		if w := post(b.handler, "wechat", "4200000002", second); w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
			t.Fatalf("a concurrent duplicate: %d %s, want 409 with Retry-After", w.Code, w.Body)
		}
		g.release()
		if w := <-done; w.Code != http.StatusOK {
			t.Fatalf("the first of the two: %d %s", w.Code, w.Body)
		}
		// A bad callback is refused the way a channel understands, and
		// refused again the same way.
		bad := callback("4200000003", "O-9999", 100, "wechat")
		refused := post(b.handler, "wechat", "4200000003", bad)
		if refused.Code != http.StatusBadRequest || !strings.Contains(refused.Body.String(), `"FAIL"`) {
			t.Fatalf("a callback for no order: %d %s", refused.Code, refused.Body)
		}
		if w := post(b.handler, "wechat", "4200000003", bad); !replayed(w) || w.Body.String() != refused.Body.String() {
			t.Fatalf("the bad callback again: %d %s, want its refusal replayed", w.Code, w.Body)
		}
		reconcile(t, b, payments.Expected{TxnID: "4200000001", Amount: 2500}, payments.Expected{TxnID: "4200000002", Amount: 990})
	})
}

// statuses counts answers.
type statuses struct {
	mu                   sync.Mutex
	first, replays, busy int
	other                map[int]int
}

func (s *statuses) add(w *httptest.ResponseRecorder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case w.Code == http.StatusOK && replayed(w):
		s.replays++
	case w.Code == http.StatusOK:
		s.first++
	case w.Code == http.StatusConflict:
		s.busy++
	default:
		if s.other == nil {
			s.other = map[int]int{}
		}
		s.other[w.Code]++
	}
}

func (s *statuses) String() string {
	return fmt.Sprintf("first %d, replays %d, 409 %d, other %v", s.first, s.replays, s.busy, s.other)
}

// retry posts until the answer is 200, as a channel re-sends: 409 and 5xx
// again after a short pause.
func retry(t *testing.T, h http.Handler, key, body string, seen *statuses) {
	deadline := time.Now().Add(time.Minute)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		w := post(h, "wechat", key, body)
		seen.add(w)
		if w.Code == http.StatusOK {
			return
		}
		if w.Code != http.StatusConflict && w.Code/100 != 5 || time.Now().After(deadline) {
			t.Errorf("gave up: %d %s", w.Code, w.Body)
			return
		}
		time.Sleep(pause/2 + rand.N(pause/2+1))
	}
}

// TestAcceptanceOneKey: 100 concurrent callbacks with one key book one
// payment; the others get 409 or the first answer.
func TestAcceptanceOneKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(Options) backend) {
		b := open(Options{Logger: quiet})
		pay := callback("4200000001", "O-1001", 2500, "wechat")
		var seen statuses
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() { seen.add(post(b.handler, "wechat", "4200000001", pay)) })
		}
		wg.Wait()
		t.Log(&seen)
		if seen.first != 1 || seen.first+seen.replays+seen.busy != 100 {
			t.Fatalf("%v: want one booking, the rest 409 or a replay", &seen)
		}
		reconcile(t, b, payments.Expected{TxnID: "4200000001", Amount: 2500})
	})
}

// TestAcceptanceFailureHalfway: the first booking fails after the payment
// was written and before the answer — its connection dropped (Postgres) or
// the handler killed by a panic — while 100 clients retry the callback.
// One payment or none, never two; the key recovers; the tables reconcile.
func TestAcceptanceFailureHalfway(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(Options) backend) {
		for _, how := range []string{"connection dropped", "panic"} {
			t.Run(how, func(t *testing.T) {
				var b backend
				var failed atomic.Bool
				b = open(Options{Logger: quiet, Halfway: func(ctx context.Context, tx any) error {
					if !failed.CompareAndSwap(false, true) {
						return nil
					}
					if how == "panic" || b.drop == nil {
						panic("killed half-way")
					}
					if err := b.drop(ctx, tx); err != nil {
						return err
					}
					return errors.New("connection dropped half-way")
				}})
				if how == "connection dropped" && b.drop == nil {
					t.Skip("SQLite has no connection to drop")
				}
				pay := callback("4200000001", "O-1001", 2500, "wechat")
				var seen statuses
				var wg sync.WaitGroup
				for range 100 {
					wg.Go(func() { retry(t, b.handler, "4200000001", pay, &seen) })
				}
				wg.Wait()
				t.Log(&seen)
				if !failed.Load() || seen.first != 1 || len(seen.other) == 0 {
					t.Fatalf("%v: want the failed booking answered 5xx, then one booking", &seen)
				}
				reconcile(t, b, payments.Expected{TxnID: "4200000001", Amount: 2500})
			})
		}
	})
}

// TestStreamReconciles posts a generated stream of callbacks — gateway
// retries, channel re-sends, bad and conflicting callbacks — from 8
// concurrent senders that retry what was not answered, and reconciles.
func TestStreamReconciles(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(Options) backend) {
		b := open(Options{Logger: quiet})
		s := payments.Generate(200, 7)
		if err := payments.CreateOrders(context.Background(), b.db, s.Orders); err != nil {
			t.Fatal(err)
		}
		work := make(chan []byte)
		var seen statuses
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for p := range work {
					var cb payments.Callback
					_ = json.Unmarshal(p, &cb) // a bad payload has no key: 400
					if cb.Channel == "" {
						cb.Channel = "wechat"
					}
					deadline := time.Now().Add(time.Minute)
					for {
						w := post(b.handler, cb.Channel, cb.TxnID, string(p))
						if w.Code != http.StatusConflict && w.Code/100 != 5 || time.Now().After(deadline) {
							seen.add(w)
							break
						}
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
		for _, p := range s.Payloads {
			work <- p
		}
		close(work)
		wg.Wait()
		t.Log(&seen)
		// A conflicting callback reuses a transaction number with another
		// amount: 422 under the same channel; under another channel (a key
		// of its own) the order refuses it, 400.
		refused := seen.other[http.StatusBadRequest] + seen.other[http.StatusRequestEntityTooLarge] + seen.other[http.StatusUnprocessableEntity]
		if seen.first != len(s.Expected) || refused != s.Bad+s.Conflicting || seen.replays == 0 {
			t.Fatalf("%v: want %d bookings, replays, and %d bad or conflicting callbacks refused", &seen, len(s.Expected), s.Bad+s.Conflicting)
		}
		reconcile(t, b, s.Expected...)
	})
}

// TestRunServes runs the program as `go run ./examples/webhook` does (on
// SQLite) and answers a callback and a payout, and their re-sends, over
// HTTP; the payout is at the bank, once.
func TestRunServes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, "127.0.0.1:0", "127.0.0.1:0", "", filepath.Join(t.TempDir(), "webhook.db"), Options{Logger: quiet}, pw)
		pw.Close()
	}()
	lines := bufio.NewReader(pr)
	var urls []string
	for range 2 {
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("startup: %v", err)
		}
		urls = append(urls, serving(t, line))
	}
	go io.Copy(io.Discard, pr)
	webhook, bank := urls[0], urls[1]
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	send := func(path, key, body string) (int, bool, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, webhook+path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true", string(b)
	}
	for _, r := range []struct {
		path, key, body string
		status          int
	}{
		{"/callbacks/wechat", "4200000009", callback("4200000009", "O-1003", 12000, "wechat"), http.StatusOK},
		{"/payouts", "p-1", `{"account":"merchant-01","amount":700}`, http.StatusCreated},
	} {
		var bodies []string
		for n := range 2 {
			status, replay, body := send(r.path, r.key, r.body)
			if status != r.status || replay != (n == 1) {
				t.Fatalf("%s request %d: %d, replayed %v: %s", r.path, n, status, replay, body)
			}
			bodies = append(bodies, body)
		}
		if bodies[0] != bodies[1] {
			t.Fatalf("%s: replay %q differs from %q", r.path, bodies[1], bodies[0])
		}
	}
	res, err := client.Get(bank + "/transfers")
	if err != nil {
		t.Fatal(err)
	}
	var transfers []Transfer
	err = json.NewDecoder(res.Body).Decode(&transfers)
	res.Body.Close()
	if err != nil || len(transfers) != 1 || transfers[0].Key != "p-1" || transfers[0].Amount != 700 {
		t.Fatalf("the bank's transfers: %+v, %v; want p-1's", transfers, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// serving is the base URL a startup line announces.
func serving(t *testing.T, line string) string {
	t.Helper()
	i := strings.Index(line, "http://")
	if i < 0 {
		t.Fatalf("startup line %q has no address", line)
	}
	return strings.Fields(line[i:])[0]
}

// TestQuotedKey: a key sent quoted, as the IETF draft specifies, is the
// same key as the bare value: the callback is booked and its re-send,
// quoted or bare, replayed.
func TestQuotedKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(Options) backend) {
		b := open(Options{Logger: quiet})
		pay := callback("4200000001", "O-1001", 2500, "wechat")
		first := post(b.handler, "wechat", `"4200000001"`, pay)
		if first.Code != http.StatusOK || replayed(first) {
			t.Fatalf(`Idempotency-Key: "4200000001": %d %s, want 200`, first.Code, first.Body)
		}
		for _, key := range []string{`"4200000001"`, "4200000001"} {
			if w := post(b.handler, "wechat", key, pay); !replayed(w) || w.Body.String() != first.Body.String() {
				t.Fatalf("re-sent with Idempotency-Key: %s: %d %s, want the first answer replayed", key, w.Code, w.Body)
			}
		}
		reconcile(t, b, payments.Expected{TxnID: "4200000001", Amount: 2500})
	})
}

// TestTenantsShareKeys: two channels may use the same transaction number:
// each is its own key and its own ledger row, and both are booked.
func TestTenantsShareKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(Options) backend) {
		b := open(Options{Logger: quiet})
		for _, c := range []struct {
			channel, order string
			amount         int64
		}{{"wechat", "O-1001", 2500}, {"alipay", "O-1002", 990}} {
			w := post(b.handler, c.channel, "4200000001", callback("4200000001", c.order, c.amount, c.channel))
			if w.Code != http.StatusOK || replayed(w) {
				t.Fatalf("%s's callback 4200000001: %d %s, want 200", c.channel, w.Code, w.Body)
			}
		}
		reconcile(t, b, payments.Expected{Channel: "wechat", TxnID: "4200000001", Amount: 2500},
			payments.Expected{Channel: "alipay", TxnID: "4200000001", Amount: 990})
	})
}

// TestCallbackFaults drives the Demo-Fault rows of the matrix on the
// transactional route: a 5xx the handler answers is stored and replayed,
// never booked; an error or a panic after booking rolls it back, stores
// nothing, and the re-send books it; an unknown knob is refused before the
// middleware, storing nothing.
func TestCallbackFaults(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(Options) backend) {
		b := open(Options{Logger: quiet})
		h := b.handler
		stored := callback("4200000001", "O-1001", 2500, "wechat")
		first := send(h, "/callbacks/wechat", "4200000001", stored, "5xx")
		if first.Code != http.StatusInternalServerError || replayed(first) || !strings.Contains(first.Body.String(), `"FAIL"`) {
			t.Fatalf("Demo-Fault: 5xx: %d %s, want the handler's 500", first.Code, first.Body)
		}
		if w := post(h, "wechat", "4200000001", stored); w.Code != http.StatusInternalServerError || !replayed(w) || w.Body.String() != first.Body.String() {
			t.Fatalf("re-sent after a stored 500: %d replayed %v %s, want the 500 replayed", w.Code, replayed(w), w.Body)
		}
		for i, f := range []string{"error", "panic"} {
			txn := fmt.Sprint(4200000002 + i)
			pay := callback(txn, Orders[1+i].ID, Orders[1+i].Amount, "wechat")
			w := send(h, "/callbacks/wechat", txn, pay, f)
			if w.Code != http.StatusInternalServerError || replayed(w) || w.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("Demo-Fault: %s: %d %s, want the middleware's 500 problem", f, w.Code, w.Body)
			}
			if w := post(h, "wechat", txn, pay); w.Code != http.StatusOK || replayed(w) {
				t.Fatalf("re-sent after Demo-Fault: %s: %d %s, want it booked now", f, w.Code, w.Body)
			}
		}
		if w := send(h, "/callbacks/wechat", "4200000009", stored, "flood"); w.Code != http.StatusBadRequest {
			t.Fatalf("Demo-Fault: flood: %d %s, want 400", w.Code, w.Body)
		}
		if w := send(h, "/callbacks/wechat", "4200000009", stored, "crash"); w.Code != http.StatusBadRequest {
			t.Fatalf("Demo-Fault: crash without Options.Crash: %d %s, want 400", w.Code, w.Body)
		}
		// Neither reached the middleware: 4200000009 is still a new key,
		// and O-1001 still unpaid (the stored 500 booked nothing).
		if w := post(h, "wechat", "4200000009", callback("4200000009", "O-1001", 2500, "wechat")); w.Code != http.StatusOK || replayed(w) {
			t.Fatalf("a key whose requests were refused by the knob: %d replayed %v %s, want it new", w.Code, replayed(w), w.Body)
		}
		reconcile(t, b, payments.Expected{TxnID: "4200000002", Amount: 990}, payments.Expected{TxnID: "4200000003", Amount: 12000},
			payments.Expected{TxnID: "4200000009", Amount: 2500})
	})
}
