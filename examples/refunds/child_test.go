package refunds_test

// The consumer runs in children — the test binary re-executed
// (testenv.ChildMain) — so that it can die by SIGKILL at a failpoint, or
// freeze (SIGSTOP) mid-call as a zombie, while the provider simulator and
// its ledger live on in the test process.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/adapters/kafka"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/effect"
	"github.com/idemkit/idem/examples/refunds"
)

const childEnv = "IDEM_REFUNDS_CHILD"

// Failpoints: where a child SIGKILLs itself, at the KillAt-th time.
const (
	killBefore = "before" // the intent is committed, the request not sent
	killDuring = "during" // the request is written, no answer read
	killAfter  = "after"  // the answer is read, the outcome not recorded
	killCommit = "commit" // the handler returned, the business commit not done
)

type childSpec struct {
	Brokers     []string
	Topic       string
	Group       string
	PgURL       string
	Schema      string
	ProviderURL string
	Kill        string
	KillAt      int
	// ZombieTrade: the child freezes itself (SIGSTOP) when its first
	// request for this trade is about to leave, after touching ZombieMark;
	// the request leaves, late, once the test continues it (SIGCONT).
	ZombieTrade string
	ZombieMark  string
	// Naive: no journal; each attempt calls the provider with a fresh
	// out_request_no, as handlers without one do.
	Naive bool
}

const (
	channelTimeout = 500 * time.Millisecond
	stepLease      = 2 * time.Second
	keyTTL         = 20 * time.Second       // the provider's and the step's
	readLagFor     = 200 * time.Millisecond // the provider's query lag
	readBackLag    = 2 * readLagFor         // the step's: above it, with room for the network
)

func (spec *childSpec) run() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pcfg, err := pgxpool.ParseConfig(spec.PgURL)
	if err != nil {
		return err
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = spec.Schema
	// A frozen child's transaction (its claim of the message's key) ends
	// as Postgres ends a real zombie's: its session is killed when idle
	// in a transaction too long, and its lock goes.
	pcfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "3000"
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{Schema: spec.Schema})
	if err != nil {
		return err
	}
	src, err := kafka.New(kafka.Config{Brokers: spec.Brokers, Topics: []string{spec.Topic}, Group: spec.Group,
		MaxWait: 100 * time.Millisecond, RequestTimeout: 3 * time.Second, ReconnectBackoff: 200 * time.Millisecond,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, RebalanceTimeout: 10 * time.Second,
		JoinGroupBackoff: 200 * time.Millisecond, CloseTimeout: 5 * time.Second, DeadLetterAutoCreate: true, Logger: log})
	if err != nil {
		return err
	}
	fp := &failpoints{spec: spec, inner: &http.Transport{}}
	ch := &refunds.Channel{URL: spec.ProviderURL, HTTP: &http.Client{Timeout: channelTimeout, Transport: fp}}
	var h consumer.Handler[pgx.Tx] = &refunds.Handler{Journal: store, Channel: ch, KeyTTL: keyTTL, ReadBackLag: readBackLag, Lease: stepLease}
	if spec.Naive {
		h = naive{ch}
	}
	c, err := consumer.New(consumer.Config[pgx.Tx]{
		Name: "refunds", Source: src, DeadLetter: src, Store: store, Handler: h,
		Middleware: []consumer.Middleware[pgx.Tx]{fp.commit},
		Key:        consumer.ByJSONField(refunds.KeyField),
		Retry:      consumer.RetryPolicy{Initial: 50 * time.Millisecond, Max: 500 * time.Millisecond, MaxAttempts: 200, MaxElapsed: 5 * time.Minute},
		Logger:     log,
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// failpoints kills or freezes the child where its spec says.
type failpoints struct {
	spec  *childSpec
	inner http.RoundTripper
	mu    sync.Mutex
	n     int
	froze bool
}

func die() { syscall.Kill(os.Getpid(), syscall.SIGKILL) } //nolint:errcheck

// at counts an occurrence of failpoint name and reports whether it fires.
func (f *failpoints) at(name string) bool {
	if f.spec.Kill != name {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return f.n == f.spec.KillAt
}

func (f *failpoints) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost {
		return f.inner.RoundTrip(r)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		TradeNo string `json:"trade_no"`
	}
	json.Unmarshal(body, &req) //nolint:errcheck
	if f.spec.ZombieTrade != "" && req.TradeNo == f.spec.ZombieTrade {
		f.mu.Lock()
		first := !f.froze
		f.froze = true
		f.mu.Unlock()
		if first {
			fmt.Fprintf(os.Stderr, "zombie: freezing at %s before request with token %s\n", time.Now().Format(time.RFC3339Nano), r.Header.Get("Fencing-Token"))
			freeze(f.spec.ZombieMark)
			// Woken: the client's timeout ran out while frozen, and the
			// provider's restart closed the pooled connections; the late
			// request goes out all the same, as a zombie's would.
			late := r.Clone(context.WithoutCancel(r.Context()))
			late.Cancel = nil //nolint:staticcheck // the client's timeout sets it
			return lateRequest(late)
		}
	}
	switch {
	case f.at(killBefore):
		die()
	case f.at(killDuring):
		r = r.WithContext(httptrace.WithClientTrace(r.Context(), &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { die() }}))
	case f.at(killAfter):
		resp, err := f.inner.RoundTrip(r)
		if err == nil {
			io.ReadAll(resp.Body) //nolint:errcheck
		}
		die()
	}
	return f.inner.RoundTrip(r)
}

// freeze touches mark, stops the whole process (SIGSTOP) and returns once
// the test has continued it (SIGCONT).
//
// The stop alone does not hold the caller: kill(2) queues a stop signal
// for the process and returns, and the group stop takes hold only when a
// thread dequeues it — often another thread, which on a loaded machine
// may not run for milliseconds while this goroutine sends its request
// first. Waiting for the SIGCONT to arrive is what makes the request late.
func freeze(mark string) {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	os.WriteFile(mark, []byte("frozen"), 0o644) //nolint:errcheck
	syscall.Kill(os.Getpid(), syscall.SIGSTOP)  //nolint:errcheck
	<-cont
}

// lateRequest sends the zombie's late request and says on the child's
// output what it sent and what came back, for the test's failure message.
func lateRequest(r *http.Request) (*http.Response, error) {
	token := r.Header.Get("Fencing-Token")
	fmt.Fprintf(os.Stderr, "zombie: woke at %s; late request with token %s to %s\n", time.Now().Format(time.RFC3339Nano), token, r.URL)
	resp, err := (&http.Transport{}).RoundTrip(r)
	if err != nil {
		fmt.Fprintf(os.Stderr, "zombie: late request with token %s failed: %v\n", token, err)
		return nil, err
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Fprintf(os.Stderr, "zombie: late request with token %s answered %d %s (read: %v)\n", token, resp.StatusCode, bytes.TrimSpace(answer), err)
	resp.Body = io.NopCloser(bytes.NewReader(answer))
	return resp, nil
}

// commit kills the child after the handler returned nil, before the
// consumer commits its transaction.
func (f *failpoints) commit(next consumer.Handler[pgx.Tx]) consumer.Handler[pgx.Tx] {
	return consumer.HandlerFunc[pgx.Tx](func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		err := next.Handle(ctx, tx, m)
		if err == nil && f.at(killCommit) {
			die()
		}
		return err
	})
}

// naive is the refund handler without the journal: every attempt mints a
// new out_request_no, so a retry after a lost answer refunds again.
type naive struct{ ch *refunds.Channel }

func (n naive) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	var r refunds.Request
	if err := json.Unmarshal(m.Value, &r); err != nil {
		return consumer.Permanent(err)
	}
	b := make([]byte, 16)
	rand.Read(b) //nolint:errcheck
	answer, err := n.ch.Refund(ctx, effect.Call{ProviderKey: hex.EncodeToString(b)}, r)
	status := "succeeded"
	if refused := (*effect.RefusedError)(nil); errors.As(err, &refused) {
		status, answer, err = "refused", refused.Result, nil
	}
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO refunds (refund_id, trade_no, amount, status, answer) VALUES ($1, $2, $3, $4, $5)`,
		r.RefundID, r.TradeNo, r.Amount, status, string(answer))
	return err
}
