package testenv

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

// OffsetSampler samples a consumer group's committed offsets (partition or
// queue number -> offset) in the background and records every offset that
// went down or disappeared between two samples.
type OffsetSampler struct {
	read func(ctx context.Context) (map[int]int64, error)
	each func(committed map[int]int64)

	stop, done chan struct{}
	once       sync.Once

	mu    sync.Mutex
	last  map[int]int64
	downs []string
	n     int
}

// SampleOffsets calls read every interval until Stop (or the end of the
// test); a failed read is skipped (the broker may be down). Each sample is
// also passed to each, when it is not nil.
func SampleOffsets(t testing.TB, every time.Duration, read func(ctx context.Context) (map[int]int64, error), each func(committed map[int]int64)) *OffsetSampler {
	s := &OffsetSampler{read: read, each: each, stop: make(chan struct{}), done: make(chan struct{}), last: map[int]int64{}}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			s.sample()
		}
	}()
	t.Cleanup(s.Stop)
	return s
}

func (s *OffsetSampler) sample() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	got, err := s.read(ctx)
	cancel()
	if err != nil {
		return
	}
	s.mu.Lock()
	s.n++
	for _, p := range slices.Sorted(maps.Keys(s.last)) {
		prev := s.last[p]
		off, ok := got[p]
		switch {
		case !ok:
			s.downs = append(s.downs, fmt.Sprintf("partition %d: committed offset %d disappeared", p, prev))
		case off < prev:
			s.downs = append(s.downs, fmt.Sprintf("partition %d: committed offset went from %d to %d", p, prev, off))
		}
	}
	maps.Copy(s.last, got)
	s.mu.Unlock()
	if s.each != nil {
		s.each(got)
	}
}

// Stop stops sampling and waits for a sample in progress. A second call
// does nothing.
func (s *OffsetSampler) Stop() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// Samples returns how many samples were taken.
func (s *OffsetSampler) Samples() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Last returns the offsets of the last sample.
func (s *OffsetSampler) Last() map[int]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.last)
}

// Decreases returns the offsets that went down or disappeared, one line
// each.
func (s *OffsetSampler) Decreases() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.downs)
}

// RequireMonotonic stops sampling and fails the test for every offset that
// went down or disappeared, and when no sample was taken (a check that
// saw nothing cannot pass).
func (s *OffsetSampler) RequireMonotonic(t testing.TB) {
	t.Helper()
	s.Stop()
	for _, d := range s.Decreases() {
		t.Error(d)
	}
	if n := s.Samples(); n == 0 {
		t.Error("no committed offset was sampled")
	} else {
		t.Logf("%d offset samples", n)
	}
}
