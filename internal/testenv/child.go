package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Child is the test binary re-executed as a child process, for the tests
// that must crash a consumer or a relay (SIGKILL: no stop, no offset
// commit) or run one beside the test. The child runs no test
// (-test.run=^$): the package's TestMain sees the variable its env sets and
// runs the child's main instead.
//
// The child dies with the test process (DieWithParent), is killed when the
// test ends, and writes the race detector's reports to files (GORACE
// log_path, exitcode=0) that CheckRaces reads, which the cleanup does too:
// a race in a child fails its test.
type Child struct {
	Cmd *exec.Cmd
	Out *SyncBuffer // stdout and stderr, unless Cmd's were set before Start

	dir  string // the race reports
	done chan struct{}
	err  error // Wait's, once done is closed

	mu       sync.Mutex
	reported map[string]bool
}

// NewChild prepares a child with env added to the test process's
// environment; set more of Cmd, then Start it. StartChild does both.
func NewChild(t testing.TB, env ...string) *Child {
	t.Helper()
	c := &Child{Out: &SyncBuffer{}, dir: t.TempDir(), done: make(chan struct{}), reported: map[string]bool{}}
	c.Cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.Cmd.Env = append(append(os.Environ(), env...),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" exitcode=0 log_path="+filepath.Join(c.dir, "race")))
	c.Cmd.Stdout, c.Cmd.Stderr = c.Out, c.Out
	DieWithParent(c.Cmd)
	return c
}

// SpecEnv is name=spec as JSON, the variable that gives a child its
// spec; ChildMain, in the child, decodes it.
func SpecEnv(t testing.TB, name string, spec any) string {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatalf("a child's spec: %v", err)
	}
	return name + "=" + string(b)
}

// ChildMain is the child's side, called first in TestMain: when the
// variable env is set (SpecEnv), it decodes its JSON into a T, runs run
// with it and exits: 0, 1 when run failed, 2 when the variable did not
// decode. In the test process (env unset) it returns.
func ChildMain[T any](env string, run func(*T) error) {
	v := os.Getenv(env)
	if v == "" {
		return
	}
	var spec T
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	if err := run(&spec); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// StartChild starts a child with env added to the environment.
func StartChild(t testing.TB, env ...string) *Child {
	t.Helper()
	c := NewChild(t, env...)
	c.Start(t)
	return c
}

// Start starts the child; it is killed, and its races checked, when the
// test ends.
func (c *Child) Start(t testing.TB) {
	t.Helper()
	if err := c.Cmd.Start(); err != nil {
		t.Fatalf("start a child: %v", err)
	}
	go func() { c.err = c.Cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		c.Kill()
		c.CheckRaces(t)
	})
}

// Done is closed when the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// Exited reports whether the child has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Err is how the child ended (exec.Cmd.Wait's error); nil before it has.
func (c *Child) Err() error {
	if !c.Exited() {
		return nil
	}
	return c.err
}

// Kill is a crash: SIGKILL, and wait until the child is gone.
func (c *Child) Kill() {
	if c.Exited() {
		return
	}
	_ = c.Cmd.Process.Kill()
	<-c.done
}

// Signal sends sig to the child (SIGTERM: stop gracefully; SIGQUIT: the
// Go runtime prints every goroutine's stack).
func (c *Child) Signal(sig os.Signal) { _ = c.Cmd.Process.Signal(sig) }

// WaitExit waits until the child has exited, and reports whether it did
// within d.
func (c *Child) WaitExit(d time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(d):
		return false
	}
}

// Killed reports whether the child ended by SIGKILL.
func (c *Child) Killed() bool {
	if !c.Exited() {
		return false
	}
	ws, ok := c.Cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// CheckRaces fails the test for each race report of the child it has not
// reported yet.
func (c *Child) CheckRaces(t testing.TB) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(c.dir, "race.*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Error(err)
			continue
		}
		c.mu.Lock()
		report := len(b) > 0 && !c.reported[f]
		c.reported[f] = c.reported[f] || report
		c.mu.Unlock()
		if report {
			t.Errorf("data race in a child process:\n%s", b)
		}
	}
}
