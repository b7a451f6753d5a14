//go:build !unix

package testenv

import "testing"

// lockKafka does nothing where flock is missing: the test environment's
// scripts need a Unix machine anyway.
func lockKafka(testing.TB, bool) {}
