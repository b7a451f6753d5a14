package rocketmq_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/adapters/rocketmq"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// The crash test's first consumer runs in a child process: this test binary,
// re-executed with childEnv set, runs child.run instead of the tests
// (testenv.ChildMain), and is killed with SIGKILL, so the client neither
// persists offsets nor unregisters. The child inherits the race
// detector's suppressions; its race reports go to a file, and the parent
// fails the test on any.
const childEnv = "IDEM_ROCKETMQ_CHILD"

// child is what a child process consumes.
type child struct {
	Namesrv []string
	PgURL   string
	Schema  string
	Topic   string
	Group   string
}

// childProc is a running child.
type childProc struct{ *testenv.Child }

// startChild runs c in a child process until the test kills it (or ends:
// then it is killed). Its output goes to the test's stderr.
func startChild(t *testing.T, c child) *childProc {
	t.Helper()
	c.Namesrv = rmqtest.Shared(t).NameServers
	c.PgURL = testenv.PostgresURL(t)
	p := testenv.NewChild(t, testenv.SpecEnv(t, childEnv, c))
	p.Cmd.Stdout, p.Cmd.Stderr = os.Stderr, os.Stderr
	p.Start(t)
	return &childProc{p}
}

// alive fails the test when the child has exited.
func (p *childProc) alive(t *testing.T) {
	t.Helper()
	if p.Exited() {
		t.Fatalf("the child consumer exited early: %v", p.Err())
	}
}

// kill is a crash: SIGKILL; then the child's race reports fail the test.
func (p *childProc) kill(t *testing.T) {
	t.Helper()
	p.Kill()
	p.CheckRaces(t)
}

// run consumes until the process is killed.
func (c child) run() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.PgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{Schema: c.Schema})
	if err != nil {
		return err
	}
	log := clientLog()
	rocketmq.SetClientLogger(log, slog.LevelError)
	src, err := rocketmq.New(rocketmq.Config{NameServers: c.Namesrv, Group: c.Group, Topics: []string{c.Topic}, Logger: log})
	if err != nil {
		return err
	}
	cfg := ledgerConsumer(src, store, pgx.Identifier{c.Schema, "effects"}.Sanitize(), 1, nil)
	cfg.Logger = log
	cons, err := consumer.New(cfg)
	if err != nil {
		return err
	}
	return fmt.Errorf("consumer stopped by itself: %v", cons.Run(ctx))
}
