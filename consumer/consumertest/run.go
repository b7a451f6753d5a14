package consumertest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/consumer"
)

// Result is what Drive observed.
type Result struct {
	Stats       consumer.Stats
	Source      SourceStats
	DeadLetters []consumer.Letter
}

// Drive runs a consumer built from cfg over msgs until every delivery is
// settled (or ctx ends, or the consumer stops by itself and Run returns its
// error), then stops it gracefully. Missing pieces are filled
// in: Source (a Source following script), DeadLetter (a DeadLetters), Clock
// (a Clock that never sleeps).
func Drive[TTx any](ctx context.Context, cfg consumer.Config[TTx], script Script, msgs ...*consumer.Message) (Result, error) {
	src, ok := cfg.Source.(*Source)
	if cfg.Source == nil {
		src, ok = NewSource(script), true
		cfg.Source = src
	}
	if !ok {
		return Result{}, errors.New("consumertest: cfg.Source must be nil or a *consumertest.Source")
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
		return Result{}, err
	}
	src.Push(msgs...)
	runErr := make(chan error, 1)
	go func() { runErr <- c.Run(context.Background()) }()
	idleCtx, stopWaiting := context.WithCancel(ctx)
	idle := make(chan error, 1)
	go func() { idle <- src.WaitIdle(idleCtx) }()
	var idleErr, rerr error
	select {
	case idleErr = <-idle:
	case rerr = <-runErr:
		// The consumer stopped by itself (a broken deployment): what it did
		// not settle stays unsettled.
		stopWaiting()
		<-idle
		runErr <- rerr
	}
	stopWaiting()
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stopErr := c.Stop(stopCtx)
	err = errors.Join(idleErr, stopErr, <-runErr)
	res := Result{Stats: c.Stats(), Source: src.Stats()}
	if dl != nil {
		res.DeadLetters = dl.Letters()
	}
	return res, err
}

// Run is Drive for tests: it fails t when the consumer does not settle
// within a minute or fails.
func Run[TTx any](t testing.TB, cfg consumer.Config[TTx], script Script, msgs ...*consumer.Message) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Drive(ctx, cfg, script, msgs...)
	if err != nil {
		t.Fatalf("consumertest: %v (%v)", err, res)
	}
	return res
}

// String summarises a result for test logs.
func (r Result) String() string {
	return fmt.Sprintf("deliveries=%d applied=%d duplicates=%d dead-lettered=%d retries=%d commits=%d crashes=%d",
		r.Source.Deliveries, r.Stats.Applied, r.Stats.Duplicates, r.Stats.DeadLettered, r.Stats.Retries, r.Stats.Commits, r.Source.Crashes)
}
