package rocketmq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
// re-executed with childEnv set, runs runChild instead of the tests, and is
// killed with SIGKILL, so the client neither persists offsets nor
// unregisters. The child inherits the race detector's suppressions; its race
// reports go to a file, and the parent fails the test on any.
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
type childProc struct {
	cmd    *exec.Cmd
	exited chan error
	dir    string
}

// startChild runs c in a child process until the test kills it (or ends:
// then it is killed).
func startChild(t *testing.T, c child) *childProc {
	t.Helper()
	dir := t.TempDir()
	c.Namesrv = rmqtest.Shared(t).NameServers
	c.PgURL = testenv.PostgresURL(t)
	spec, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" exitcode=0 log_path="+filepath.Join(dir, "race")))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &childProc{cmd: cmd, exited: make(chan error, 1), dir: dir}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			p.kill(t)
		}
	})
	return p
}

// alive fails the test when the child has exited.
func (p *childProc) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("the child consumer exited early: %v", err)
	default:
	}
}

// kill is a crash: SIGKILL.
func (p *childProc) kill(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.checkRaces(t)
}

// checkRaces fails the test for every race report of the child.
func (p *childProc) checkRaces(t *testing.T) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(p.dir, "race.*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 0 {
			t.Errorf("data race in the child consumer:\n%s", b)
		}
	}
}

// runChild is the child process's main.
func runChild() int {
	var c child
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &c); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	if err := c.run(); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
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
