package testenv

import (
	"os/exec"
	"syscall"
)

// DieWithParent has cmd killed (SIGKILL) when the test process dies, by go
// test's timeout or a crash: no server or child outlives its test.
func DieWithParent(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
