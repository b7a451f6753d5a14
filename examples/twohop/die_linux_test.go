package twohop_test

import (
	"os/exec"
	"syscall"
)

// dieWithParent kills the child with SIGKILL when the test process dies.
func dieWithParent(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
