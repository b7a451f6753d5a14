//go:build !race

package readmetest

const raceEnabled = false
