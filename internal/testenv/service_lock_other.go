//go:build !unix

package testenv

import (
	"testing"
)

// lockService does nothing where flock is missing: the test environment's
// scripts need a Unix machine anyway.
func lockService(testing.TB, string, bool) {}
