package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// PrivateRedis is a redis-server of one test's own, on a free port of
// 127.0.0.1 with its data under the test's temporary directory, for tests
// that restart Redis, flush it, or bring it back from an old snapshot
// without disturbing the shared server (scripts/testenv/redis.sh) that
// other tests use meanwhile. It saves nothing by itself (save ""): a
// snapshot is taken when the test asks (Snapshot), and a restart loads
// the one the test names, or starts empty.
type PrivateRedis struct {
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	log    *SyncBuffer
}

// NewPrivateRedis starts a redis-server for t, stopped when t ends. The
// binary is redis-server on PATH (scripts/testenv.sh up redis installs
// it); without it the test skips, or fails under CI=true.
func NewPrivateRedis(t testing.TB) *PrivateRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := "redis-server is not on PATH: install it with `scripts/testenv.sh up redis` (Debian's redis-server package)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	r := &PrivateRedis{dir: t.TempDir(), port: FreePort(t)}
	t.Cleanup(r.stop)
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
	return r
}

// Addr is the server's host:port.
func (r *PrivateRedis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *PrivateRedis) dump() string { return filepath.Join(r.dir, "dump.rdb") }

func (r *PrivateRedis) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	cmd := exec.Command("redis-server",
		"--bind", "127.0.0.1", "--port", strconv.Itoa(r.port), "--protected-mode", "no",
		"--dir", r.dir, "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--maxmemory-policy", "volatile-lru")
	r.log = &SyncBuffer{}
	cmd.Stdout, cmd.Stderr = r.log, r.log
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("private redis: start: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	r.cmd, r.exited = cmd, exited
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := r.ping(); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("private redis on %s not ready after 30s: %w\n%s", r.Addr(), err, r.log)
		}
		select {
		case <-exited:
			return fmt.Errorf("private redis on %s exited during startup:\n%s", r.Addr(), r.log)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ping sends PING in RESP and expects PONG (no client library: testenv
// does not depend on one).
func (r *PrivateRedis) ping() error {
	_, err := r.Do("PING")
	return err
}

// Do runs one command on a connection of its own and returns its simple
// reply ("+OK", "+PONG", ":1", or the bulk string's text); an error reply
// is an error.
func (r *PrivateRedis) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", r.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	rd := bufio.NewReader(c)
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "-"):
		return "", errors.New(line[1:])
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return line, nil
}

// Snapshot saves the data set (SAVE) and returns a copy of the RDB file,
// to give to Restart later.
func (r *PrivateRedis) Snapshot() (string, error) {
	if _, err := r.Do("SAVE"); err != nil {
		return "", fmt.Errorf("private redis: SAVE: %w", err)
	}
	b, err := os.ReadFile(r.dump())
	if err != nil {
		return "", fmt.Errorf("private redis: read the snapshot: %w", err)
	}
	f, err := os.CreateTemp(r.dir, "snapshot-*.rdb")
	if err == nil {
		_, err = f.Write(b)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return "", fmt.Errorf("private redis: copy the snapshot: %w", err)
	}
	return f.Name(), nil
}

// Restart kills the server (SIGKILL: a crash) and starts it again on the
// same port, from snapshot (a path Snapshot returned), or empty when
// snapshot is "".
func (r *PrivateRedis) Restart(snapshot string) error {
	r.Kill()
	return r.Start(snapshot)
}

// RestartSaved stops the server cleanly, saving its data set on the way
// down (SHUTDOWN SAVE), and starts it again from that data: a clean
// restart of a server that persists.
func (r *PrivateRedis) RestartSaved() error {
	_, _ = r.Do("SHUTDOWN", "SAVE") // no reply: the server closes the connection
	r.mu.Lock()
	exited := r.exited
	r.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
	}
	r.stop() // kills it if it did not stop; reaps it
	return r.start()
}

// Kill kills the server (SIGKILL) and waits until it is gone.
func (r *PrivateRedis) Kill() { r.stop() }

// Start starts a killed server again on its port, from snapshot (a path
// Snapshot returned), or empty when snapshot is "".
func (r *PrivateRedis) Start(snapshot string) error {
	_ = os.Remove(r.dump())
	if snapshot != "" {
		b, err := os.ReadFile(snapshot)
		if err == nil {
			err = os.WriteFile(r.dump(), b, 0o600)
		}
		if err != nil {
			return fmt.Errorf("private redis: restore %s: %w", snapshot, err)
		}
	}
	return r.start()
}

func (r *PrivateRedis) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.exited // the port is free again, for the restart
	r.cmd = nil
}
