//go:build !linux

package testenv

import "os/exec"

// DieWithParent does nothing where Pdeathsig does not exist.
func DieWithParent(*exec.Cmd) {}
