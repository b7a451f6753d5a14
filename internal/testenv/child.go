package testenv

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// childEnv carries, to a test binary run again by StartChild, the name of
// the program it is to be and its arguments.
const childEnv = "IDEM_TEST_CHILD"

type childSpec struct {
	Name string
	Args []string
}

// RunChild, first in TestMain, turns this process into the program name
// when StartChild started it as that: it runs main with args as its
// command line (a fresh flag.CommandLine, os.Args[1:] = args) and exits
// with 0 when main returns. In any other process it returns at once.
//
//	func TestMain(m *testing.M) {
//		testenv.RunChild("webhook", main)
//		goleak.VerifyTestMain(m)
//	}
func RunChild(name string, main func()) {
	var spec childSpec
	if v := os.Getenv(childEnv); v == "" || json.Unmarshal([]byte(v), &spec) != nil || spec.Name != name {
		return
	}
	os.Args = append([]string{os.Args[0]}, spec.Args...)
	flag.CommandLine = flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	main()
	os.Exit(0)
}

// A Child is a program run in a child process: this test binary again,
// turned into the program by RunChild. A test kills it as a crash would
// (Kill, or the program kills itself) and starts it again.
type Child struct {
	cmd  *exec.Cmd
	out  SyncBuffer
	done chan struct{} // closed when cmd has exited
}

// StartChild runs the program name with args in a child process, its
// stdout and stderr collected (Output). The child is killed when the test
// ends, and dies with the test process (Linux).
func StartChild(t testing.TB, name string, args ...string) *Child {
	t.Helper()
	spec, err := json.Marshal(childSpec{Name: name, Args: args})
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{done: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	dieWithParent(c.cmd)
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
	})
	return c
}

// Output is what the child wrote to stdout and stderr so far.
func (c *Child) Output() string { return c.out.String() }

// Kill kills the child with SIGKILL and waits for it to exit.
func (c *Child) Kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// Exited reports whether the child has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// WaitKilled waits up to d for the child to exit and fails the test unless
// SIGKILL ended it.
func (c *Child) WaitKilled(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(d):
		t.Fatalf("the child did not exit within %v:\n%s", d, c.Output())
	}
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child ended with %v, not SIGKILL:\n%s", c.cmd.ProcessState, c.Output())
	}
}

// String names the child for test messages.
func (c *Child) String() string { return fmt.Sprintf("child %d", c.cmd.Process.Pid) }
