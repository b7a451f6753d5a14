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
// a test that kills the service holds it exclusively. go test runs packages
// in parallel processes; the lock keeps a test that restarts the service
// apart from the others. The kernel drops it when a process dies. The
// service scripts' wait_tests_done takes the same lock.
//
// A waiting exclusive locker goes first: it holds the service's gate file
// while it waits, and shared lockers pass the gate (shared, briefly) before
// they lock, so that a stream of overlapping shared holders — every test of
// the packages running beside it — cannot starve it.
func lockService(t testing.TB, service string, exclusive bool) {
	t.Helper()
	base := filepath.Join(os.TempDir(), "idem-"+service+"-tests")
	gate := openLock(t, base+".gate")
	main := openLock(t, base+".lock")
	if exclusive {
		flockWait(t, gate, syscall.LOCK_EX)
		flockWait(t, main, syscall.LOCK_EX)
		t.Cleanup(func() {
			unlock(main)
			unlock(gate)
		})
		return
	}
	flockWait(t, gate, syscall.LOCK_SH)
	flockWait(t, main, syscall.LOCK_SH)
	unlock(gate)
	t.Cleanup(func() { unlock(main) })
}

func openLock(t testing.TB, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		t.Fatalf("test lock: %v", err)
	}
	return f
}

func flockWait(t testing.TB, f *os.File, how int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			t.Fatalf("test lock %s: %v", f.Name(), err)
		}
		if time.Now().After(deadline) {
			f.Close()
			t.Fatalf("test lock %s: still held by another test after 10 minutes", f.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func unlock(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	f.Close()
}
