package twohop_test

// The relay child: this test binary, re-executed with childEnv set to a
// JSON childSpec, runs a relay instead of the tests — and SIGKILLs itself
// between publishing and marking when the spec says so. The failpoint wraps
// the Publisher; the relay has none.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/outbox"
)

const childEnv = "IDEM_TWOHOP_RELAY_CHILD"

// childSpec is what a relay child publishes, and when it dies.
type childSpec struct {
	Broker string   // "kafka" or "rocketmq"
	Addrs  []string // Kafka brokers or RocketMQ name servers
	PgURL  string
	Schema string // the outbox's
	App    string // application_name of its connections
	// KillAfter: once this many records were published, SIGKILL right
	// after the Publish call that got there returned — before the relay
	// marks them. 0: never.
	KillAfter int
	// KilledLog receives the IDs of the records that last call published,
	// one a line, synced before the kill.
	KilledLog string
	BatchSize int
}

func (spec *childSpec) run() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(spec.PgURL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = spec.App
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, err := outbox.New(pool, outbox.Config{Schema: spec.Schema})
	if err != nil {
		return err
	}
	rocketmq.SetClientLogger(slog.New(slog.NewTextHandler(io.Discard, nil)), slog.LevelError)
	p, err := newPublisher(spec.Broker, spec.Addrs)
	if err != nil {
		return err
	}
	defer p.Close()
	var pub outbox.Publisher = p
	if spec.KillAfter > 0 {
		pub = &killer{inner: pub, after: spec.KillAfter, log: spec.KilledLog}
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Outbox: ob, Publisher: pub, BatchSize: spec.BatchSize,
		PollInterval: 5 * time.Millisecond, Backoff: consumer.RetryPolicy{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond},
		Logger: log})
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		if _, ok := <-sigs; ok {
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_ = relay.Stop(sctx)
		}
	}()
	err = relay.Run(ctx)
	signal.Stop(sigs)
	close(sigs)
	st, _ := json.Marshal(relay.Stats())
	fmt.Printf("relay stats %s\n", st)
	return err
}

// killer is the failpoint: it dies between publish and mark.
type killer struct {
	inner outbox.Publisher
	after int
	sent  int
	log   string
}

func (k *killer) Publish(ctx context.Context, recs []outbox.Record, errs []error) {
	k.inner.Publish(ctx, recs, errs)
	var ids []string
	for i := range recs {
		if errs[i] == nil {
			ids = append(ids, recs[i].ID)
		}
	}
	k.sent += len(ids)
	if k.sent < k.after || len(ids) == 0 {
		return
	}
	f, err := os.Create(k.log)
	if err == nil {
		_, err = f.WriteString(strings.Join(ids, "\n") + "\n")
		err = errors.Join(err, f.Sync(), f.Close())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: killed log:", err)
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; wait for it
}

// relayChild is a running relay child.
type relayChild struct{ *testenv.Child }

func startRelayChild(t *testing.T, spec childSpec) *relayChild {
	t.Helper()
	return &relayChild{testenv.StartChild(t, testenv.SpecEnv(t, childEnv, spec))}
}

// waitKilled waits until the child killed itself with SIGKILL.
func (c *relayChild) waitKilled(t *testing.T, timeout time.Duration) {
	t.Helper()
	if !c.WaitExit(timeout) {
		t.Fatalf("the relay child did not reach its failpoint within %v:\n%s", timeout, c.Out)
	}
	if !c.Killed() {
		t.Fatalf("the relay child ended with %v, not SIGKILL:\n%s", c.Err(), c.Out)
	}
}

// terminate stops the child with SIGTERM and expects a clean exit.
func (c *relayChild) terminate(t *testing.T) {
	t.Helper()
	c.Signal(syscall.SIGTERM)
	if !c.WaitExit(time.Minute) {
		t.Fatalf("the relay child did not stop within a minute of SIGTERM:\n%s", c.Out)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("the relay child: %v\n%s", err, c.Out)
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}
