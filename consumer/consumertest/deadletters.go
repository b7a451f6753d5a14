package consumertest

import (
	"context"
	"errors"
	"sync"

	"github.com/idemkit/idem/consumer"
)

// DeadLetters records dead letters in memory. FailFirst makes the first n
// writes fail, to check that nothing is acked before the write succeeds.
type DeadLetters struct {
	FailFirst int

	mu      sync.Mutex
	calls   int
	letters []consumer.Letter
}

// ErrSinkDown is what a failing DeadLetters write returns.
var ErrSinkDown = errors.New("consumertest: dead-letter sink down")

// DeadLetter records l.
func (d *DeadLetters) DeadLetter(_ context.Context, l consumer.Letter) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	if d.calls <= d.FailFirst {
		return ErrSinkDown
	}
	d.letters = append(d.letters, l)
	return nil
}

// Letters returns the recorded letters.
func (d *DeadLetters) Letters() []consumer.Letter {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]consumer.Letter(nil), d.letters...)
}

// Calls returns how many writes were attempted.
func (d *DeadLetters) Calls() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}
