package testenv

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Script runs scripts/testenv/<service>.sh with args (kill, start,
// status, ...), fails the test when it fails, and returns its output.
func Script(t testing.TB, service string, args ...string) string {
	t.Helper()
	out, err := RunScript(service, args...)
	if err != nil {
		t.Fatalf("%s.sh %s: %v\n%s", service, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// RunScript runs scripts/testenv/<service>.sh with args and returns its
// combined output, for a caller that handles the failure itself (or
// runs it outside the test's goroutine).
func RunScript(service string, args ...string) ([]byte, error) {
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "testenv", service+".sh")
	return exec.Command(path, args...).CombinedOutput()
}
