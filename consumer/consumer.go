package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/retry"
)

// Consumer runs a Source through a Handler with deduplication: one ordered
// lane per partition or queue (or Config.KeyLanes per partition, by record
// key), lanes in parallel, each batch one transaction.
type Consumer[TTx any] struct {
	cfg         Config[TTx]
	handler     Handler[TTx]       // nil when batch is set
	batch       BatchHandler[TTx]  // nil when handler is set
	desc        source.Description // what the Source declared, once, in New
	source      SourceInfo         // desc's System and Group
	policy      retry.Policy       // bounded: failures a message causes
	infra       retry.Policy       // unbounded: failures of the database or the dead-letter sink
	nonBlocking *NonBlocking       // Config.Retries when it is NonBlocking, defaults set
	parking     parking            // where NonBlocking.KeyOrdered parks record keys; else nil
	parkLimits  dedup.ParkLimits   // NonBlocking's MaxParkedDepth and MaxParkedWait
	parkStats   parkStats          // Health's ParkStats, read at most every parkStatsEvery
	stats       counters
	keyCheck    keyCheck              // Config.Key's failures over the first messages
	marks       dedup.Watermarks[TTx] // the Store's entity watermarks, with Config.Entity; else nil
	journal     dedup.Journal         // the Store's effect journal, with marks; else nil (see stale)
	txSteps     dedup.TxSteps[TTx]    // journal, when it reads steps in the Store's transactions; else nil

	lanesMu sync.Mutex
	lanes   map[laneID]*lane[TTx]
	closed  bool // guarded by lanesMu: no new messages are taken
	lanesWG sync.WaitGroup

	runMu    sync.Mutex
	started  bool
	stopped  bool
	stopSrc  context.CancelFunc
	stopWork context.CancelFunc
	fatalErr error // guarded by runMu: why the consumer stopped itself
	done     chan struct{}

	progress atomic.Int64 // when a batch was last acknowledged, Unix ns; see Health
}

// New validates cfg and returns a Consumer. The error names every field that
// is wrong.
func New[TTx any](cfg Config[TTx]) (*Consumer[TTx], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	mws := append([]Middleware[TTx]{Recover[TTx]()}, cfg.Middleware...)
	r := cfg.Retry
	policy := retry.Policy{
		Initial: r.Initial, Max: r.Max, Multiplier: r.Multiplier, Jitter: r.Jitter,
		MaxAttempts: r.MaxAttempts, MaxElapsed: r.MaxElapsed, Clock: cfg.Clock,
	}
	nb := nonBlockingOf(cfg.Retries)
	if nb != nil {
		policy.MaxAttempts = nb.Attempts // in the lane; then the retry destination
	}
	infra := policy
	infra.MaxAttempts, infra.MaxElapsed = 0, 0
	var h Handler[TTx]
	if cfg.Handler != nil {
		h = Chain(cfg.Handler, mws...)
	}
	desc := cfg.Source.Describe()
	if o, ok := cfg.Observer.(DeadLetterObserver); ok {
		cfg.DeadLetter = o.ObserveDeadLetter(cfg.DeadLetter)
	}
	marks, _ := cfg.Store.(dedup.Watermarks[TTx])
	journal, _ := cfg.Store.(dedup.Journal)
	txSteps, _ := cfg.Store.(dedup.TxSteps[TTx])
	if cfg.Entity == nil {
		marks, journal, txSteps = nil, nil, nil
	}
	return &Consumer[TTx]{
		marks:       marks,
		journal:     journal,
		txSteps:     txSteps,
		cfg:         cfg,
		handler:     h,
		batch:       cfg.BatchHandler,
		desc:        desc,
		source:      SourceInfo{System: desc.System, Group: desc.Group},
		policy:      policy,
		infra:       infra,
		nonBlocking: nb,
		parking:     parkingOf(nb, cfg.Store),
		parkLimits:  parkLimitsOf(nb),
		lanes:       make(map[laneID]*lane[TTx]),
		done:        make(chan struct{}),
	}, nil
}

// Run checks the store (dedup.Store.Check: waiting while the database does
// not answer, returning at once an error wrapping dedup.ErrNotMigrated when
// its table is missing), then consumes until ctx ends, Stop is called, the
// Source fails or the deployment turns out broken (an error the store
// classifies as dedup.ClassFatal: a missing table or privilege, a store
// breaking its contract), which Run returns wrapped.
//
// When ctx ends, Run drains as Stop does for up to Config.DrainTimeout —
// stops fetching, finishes and acknowledges what it holds — then cancels
// what is still in flight (rolled back, released unacknowledged) and
// returns. With DrainTimeout zero (the default) that is at once: a hard
// stop. Either way nothing is lost; a message not acknowledged is delivered
// again. Run returns the Source's error, or nil when it was stopped. A
// Consumer runs once.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	c.runMu.Lock()
	if c.started {
		c.runMu.Unlock()
		return errors.New("consumer: Run called twice")
	}
	c.started = true
	c.progress.Store(time.Now().UnixNano())
	parent := ctx
	if c.cfg.DrainTimeout > 0 {
		parent = context.WithoutCancel(ctx) // ctx's end drains: see drainOnCancel
	}
	srcCtx, stopSrc := context.WithCancel(parent)
	workCtx, stopWork := context.WithCancel(parent)
	c.stopSrc, c.stopWork = stopSrc, stopWork
	if c.stopped {
		stopSrc()
	}
	c.runMu.Unlock()
	defer close(c.done)
	defer stopWork()
	defer stopSrc()
	if c.cfg.DrainTimeout > 0 {
		go c.drainOnCancel(ctx)
	}

	if err := c.checkStore(srcCtx); err != nil {
		return err
	}
	err := c.cfg.Source.Run(srcCtx, func(ctx context.Context, m *Message) error {
		return c.deliver(ctx, workCtx, m)
	})

	c.lanesMu.Lock()
	c.closed = true
	for _, l := range c.lanes {
		close(l.in)
	}
	c.lanesMu.Unlock()
	c.lanesWG.Wait()

	c.runMu.Lock()
	fatal := c.fatalErr
	c.runMu.Unlock()
	if fatal != nil {
		return fmt.Errorf("consumer: stopped: %w", fatal)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// drainOnCancel stops the consumer gracefully when ctx ends, within
// Config.DrainTimeout.
func (c *Consumer[TTx]) drainOnCancel(ctx context.Context) {
	select {
	case <-c.done:
	case <-ctx.Done():
		stopCtx, cancel := context.WithTimeout(context.Background(), c.cfg.DrainTimeout)
		defer cancel()
		if err := c.Stop(stopCtx); err != nil {
			c.cfg.Logger.Warn("idem: drain cut short: in-flight work rolled back and released", slog.Duration("drain_timeout", c.cfg.DrainTimeout))
		}
	}
}

// checkStore waits until the store answers and refuses to start on one that
// is not ready: a table never migrated would fail every message.
func (c *Consumer[TTx]) checkStore(ctx context.Context) error {
	var notReady error
	_ = c.untilDone(ctx, nil, "store check", func() error { return c.cfg.Store.Check(ctx) }, func(err error) (error, bool) {
		if class := classify(err, c.cfg.Store.ClassifyError); class == dedup.ClassFatal || class == dedup.ClassPermanent || errors.Is(err, dedup.ErrNotMigrated) {
			c.cfg.Logger.Error("idem: store not ready", slog.Any("error", err))
			notReady = fmt.Errorf("consumer: store not ready: %w", err)
			return notReady, true
		}
		return nil, false
	})
	return notReady // nil: the store answers, or the consumer stopped before it started
}

// Stop stops fetching, finishes the batches in flight and the messages
// already queued, acknowledges what committed and returns. Past ctx's
// deadline it cancels the work in flight (rolled back, not acknowledged),
// waits for the lanes to let go and returns ctx.Err(). Stop before Run makes
// Run return at once; Stop after Run returned is a no-op.
func (c *Consumer[TTx]) Stop(ctx context.Context) error {
	c.runMu.Lock()
	c.stopped = true
	started := c.started
	if started {
		c.stopSrc()
	}
	c.runMu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		c.stopWork()
		<-c.done
		return ctx.Err()
	}
}

// Name is Config.Name: the scope of the consumer's keys, and the name its
// telemetry and health carry.
func (c *Consumer[TTx]) Name() string { return c.cfg.Name }

// SourceInfo is what the Source says of itself (the System and Group of
// its source.Description); zero when it says nothing.
func (c *Consumer[TTx]) SourceInfo() SourceInfo { return c.source }

// Stats returns counters since the consumer started.
func (c *Consumer[TTx]) Stats() Stats { return c.stats.snapshot() }

// fatal stops the consumer over a broken deployment: the lane stops where it
// is (its messages are released, none acknowledged), the source stops
// fetching, the other lanes finish what they hold, and Run returns err.
func (c *Consumer[TTx]) fatal(l *lane[TTx], err error) error {
	l.halt()
	c.runMu.Lock()
	first := c.fatalErr == nil
	if first {
		c.fatalErr = err
		c.stopped = true
		if c.stopSrc != nil {
			c.stopSrc()
		}
	}
	c.runMu.Unlock()
	if first {
		c.cfg.Logger.Error("idem: consumer stopping: the deployment is broken, not the message",
			slog.String("lane", l.name), slog.Any("error", err))
	}
	return ErrLaneStopped
}
