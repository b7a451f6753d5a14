package consumertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
)

// Result is what Run observed.
type Result struct {
	Stats       consumer.Stats
	Source      SourceStats
	DeadLetters []consumer.Letter
}

// Run drives a consumer built from cfg over msgs until every delivery is
// settled, then stops it. Missing pieces are filled in: Source (a Source
// following script), DeadLetter (a DeadLetters), Clock (a Clock that never
// sleeps). It fails the test when the consumer does not settle within a
// minute.
func Run[TTx any](t testing.TB, cfg consumer.Config[TTx], script Script, msgs ...*consumer.Message) Result {
	t.Helper()
	src, ok := cfg.Source.(*Source)
	if cfg.Source == nil {
		src, ok = NewSource(script), true
		cfg.Source = src
	}
	if !ok {
		t.Fatal("consumertest.Run: cfg.Source must be nil or a *consumertest.Source")
	}
	dl, _ := cfg.DeadLetter.(*DeadLetters)
	if cfg.DeadLetter == nil {
		dl = &DeadLetters{}
		cfg.DeadLetter = dl
	}
	if cfg.Clock == nil {
		cfg.Clock = NewClock()
	}
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}
	src.Push(msgs...)
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := src.WaitIdle(ctx); err != nil {
		_ = c.Stop(context.Background())
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	res := Result{Stats: c.Stats(), Source: src.Stats()}
	if dl != nil {
		res.DeadLetters = dl.Letters()
	}
	return res
}

// String summarises a result for test logs.
func (r Result) String() string {
	return fmt.Sprintf("deliveries=%d applied=%d duplicates=%d dead-lettered=%d retries=%d commits=%d crashes=%d",
		r.Source.Deliveries, r.Stats.Applied, r.Stats.Duplicates, r.Stats.DeadLettered, r.Stats.Retries, r.Stats.Commits, r.Source.Crashes)
}
