//go:build unix

package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// lockKafka takes a shared (or exclusive) lock on a file that all test
// processes of the machine see, until the test ends. go test runs packages
// in parallel processes; the lock keeps a test that restarts the broker
// apart from the others. The kernel drops it when a process dies.
func lockKafka(t testing.TB, exclusive bool) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "idem-kafka-tests.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatalf("kafka test lock: %v", err)
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			t.Fatalf("kafka test lock %s: %v", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			t.Fatalf("kafka test lock %s: still held by another test after 10 minutes", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}
