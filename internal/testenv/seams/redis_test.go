package seams_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a private redis-server on a free port of the loopback,
// with its data directory in the test's temporary directory: the Redis
// front's runs flush it, restart it and restore it from old snapshots,
// which the shared server of the test environment must never see.
type redisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
	snap string // the last snapshot, "" before the first
}

// startRedis starts a private redis-server (the test environment installs
// it: scripts/testenv.sh up redis); without one the test skips, and fails
// under CI=true.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		msg := "redis-server is not installed: run `scripts/testenv.sh up redis` (it installs it)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	s := &redisServer{t: t, bin: bin, dir: t.TempDir()}
	for try := 0; ; try++ {
		s.port = freePort(t)
		err := s.start()
		if err == nil {
			break
		}
		if try == 2 {
			t.Fatalf("private redis-server: %v", err)
		}
	}
	t.Cleanup(func() { s.kill() })
	return s
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// start runs redis-server without automatic snapshots; it loads dump.rdb
// when the directory holds one.
func (s *redisServer) start() error {
	logf, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(s.port), "--dir", s.dir,
		"--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	c := s.client()
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited at start (log %s)", s.port, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on port %d not ready after 10s: %v", s.port, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *redisServer) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 500 {
		b = b[len(b)-500:]
	}
	return string(b)
}

// client is a client of the server for the test's own commands.
func (s *redisServer) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr(), ContextTimeoutEnabled: true, DialTimeout: time.Second, MaxRetries: -1})
}

// shutdown stops the server, saving its data first when save is set.
func (s *redisServer) shutdown(save bool) {
	c := s.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if save {
		_ = c.ShutdownSave(ctx).Err() // the connection closes: no reply
	} else {
		_ = c.ShutdownNoSave(ctx).Err()
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.kill()
	}
}

// kill ends the server process this test started, if it runs.
func (s *redisServer) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// snapshot writes the server's data to a file of its own (SAVE), the
// snapshot that restore brings back.
func (s *redisServer) snapshot(ctx context.Context) error {
	c := s.client()
	defer c.Close()
	if err := c.Save(ctx).Err(); err != nil {
		return fmt.Errorf("redis SAVE: %w", err)
	}
	snap := filepath.Join(s.dir, "snapshot.rdb")
	if err := copyFile(filepath.Join(s.dir, "dump.rdb"), snap); err != nil {
		return err
	}
	s.snap = snap
	return nil
}

// restore restarts the server from the last snapshot, as an operator
// restoring a backup (or a replica promoted from an old state) would.
// Without a snapshot it restarts empty.
func (s *redisServer) restore() error {
	s.shutdown(false)
	dump := filepath.Join(s.dir, "dump.rdb")
	if err := os.Remove(dump); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if s.snap != "" {
		if err := copyFile(s.snap, dump); err != nil {
			return err
		}
	}
	return s.start()
}

// restart restarts the server: with persist, from the data it saves on the
// way down; without, empty.
func (s *redisServer) restart(persist bool) error {
	s.shutdown(persist)
	if !persist {
		if err := os.Remove(filepath.Join(s.dir, "dump.rdb")); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return s.start()
}

// flush empties the server (FLUSHALL).
func (s *redisServer) flush(ctx context.Context) error {
	c := s.client()
	defer c.Close()
	return c.FlushAll(ctx).Err()
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
