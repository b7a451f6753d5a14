//go:build race

package readmetest

// raceEnabled: the blocks are built with -race too, to share the build cache
// with the run that runs this test.
const raceEnabled = true
