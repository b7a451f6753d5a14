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

// lockService takes a shared (or exclusive) lock on a file named for the
// service that all test processes of the machine see, until the test ends:
// a test that kills the service holds it exclusively. The kernel drops it
// when a process dies. (lockKafka is the same for Kafka.)
func lockService(t testing.TB, service string, exclusive bool) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "idem-"+service+"-tests.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatalf("%s test lock: %v", service, err)
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
			t.Fatalf("%s test lock %s: %v", service, path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			t.Fatalf("%s test lock %s: still held by another test after 10 minutes", service, path)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}
