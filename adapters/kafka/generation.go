package kafka

import (
	"context"
	"errors"
	"log/slog"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer/source"
)

// generation is this member's part of one consumer group generation: the
// partitions assigned to it and the committer that commits their offsets.
//
// Fencing: every goroutine of a generation runs under kafka-go's
// Generation.Start, so the next generation (whatever it assigns to whom) is
// not joined before all of them returned; offsets go through the
// generation's own coordinator connection with its generation ID, which the
// coordinator rejects once the group moved on. A member therefore never
// commits for a partition it no longer owns, and a slow member's late commit
// cannot move a group's offset backwards.
type generation struct {
	kg    *kafkago.Generation
	parts []*partition
	wake  chan struct{} // cap 1: a watermark moved
}

func (g *generation) wakeCommitter() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// startGeneration installs kg's assignments and starts their fetchers and
// the committer. It returns at once; the generation runs until kafka-go ends
// it.
func (s *Source) startGeneration(ctx context.Context, kg *kafkago.Generation, deliver source.DeliverFunc) {
	g := &generation{kg: kg, wake: make(chan struct{}, 1)}
	assigned := make([]string, 0, 8)
	fromStore := false
	for _, topic := range s.cfg.Topics {
		assignments := kg.Assignments[topic]
		stored := s.startOffsets(ctx, topic, assignments)
		for _, a := range assignments {
			p := newPartition(g, topic, a)
			if _, retry := s.retryOf[topic]; retry && a.Offset < 0 {
				// A retry partition without a committed offset: none of its
				// copies was acknowledged yet, and each stands for an
				// original that was (it was acknowledged once its copy was
				// durable). Config.StartFrom is for the user's topics; a
				// retry topic starts at its first record, whatever it says.
				p.start = kafkago.FirstOffset
			}
			if next, ok := stored[int32(a.ID)]; ok && next > a.Offset {
				// Below the store's next offset everything is settled: fetch
				// from there, and bring the group's (advisory) offset up to
				// it, even when nothing more arrives.
				s.log.Debug("kafka: partition starts at the store's next offset", slog.String("topic", topic),
					slog.Int("partition", a.ID), slog.Int64("group_offset", a.Offset), slog.Int64("store_offset", next))
				p.start, p.next = next, next
				fromStore = true
			}
			g.parts = append(g.parts, p)
			assigned = append(assigned, p.lane)
		}
	}
	s.mu.Lock()
	for _, p := range g.parts {
		s.parts[p.lane] = p
	}
	s.mu.Unlock()
	s.log.Info("kafka: joined a generation", slog.Int("generation", int(kg.ID)),
		slog.String("member", kg.MemberID), slog.Any("partitions", assigned))

	kg.Start(func(gctx context.Context) { s.commitLoop(gctx, g) })
	if fromStore {
		g.wakeCommitter()
	}
	if s.cfg.PartitionWatchInterval > 0 {
		kg.Start(s.watchPartitions)
	}
	for _, p := range g.parts {
		s.fetchers.Add(1)
		kg.Start(func(gctx context.Context) {
			fctx, cancel := context.WithCancel(ctx)
			stop := context.AfterFunc(gctx, cancel)
			s.fetch(fctx, p, deliver)
			stop()
			cancel()
			s.fetchers.Done()
			// A function that returns ends the generation for everyone:
			// a partition that stopped (its lane stopped, or Run's ctx
			// ended) waits for the generation to end by itself.
			<-gctx.Done()
		})
	}
}

// commitLoop commits the generation's watermarks until the generation ends,
// then makes a last commit of what was acked and ends the assignments.
func (s *Source) commitLoop(gctx context.Context, g *generation) {
	var tick <-chan time.Time
	if s.cfg.CommitInterval > 0 {
		t := time.NewTicker(s.cfg.CommitInterval)
		defer t.Stop()
		tick = t.C
	}
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	failures := 0
	bo := s.reconnectBackoff()
	commit := func() {
		err := s.commit(g)
		if err == nil {
			failures = 0
			bo.Reset()
			return
		}
		failures++
		s.log.Warn("kafka: offset commit failed; retrying", slog.Int("generation", int(g.kg.ID)),
			slog.Int("failures", failures), slog.Any("error", err))
		retry.Reset(bo.NextBackOff())
	}
	for {
		select {
		case <-gctx.Done():
			// The coordinator accepts this generation's commits until the
			// group completes its next join, and kafka-go does not rejoin
			// before this function returns: commit what was acked.
			for _, p := range g.parts {
				p.end()
			}
			if err := s.commit(g); err != nil {
				s.log.Info("kafka: last commit of a generation failed; its partitions resume from the previous commit",
					slog.Int("generation", int(g.kg.ID)), slog.Any("error", err))
			}
			s.signalSettled()
			return
		case <-g.wake:
			if failures == 0 { // else the retry timer is due
				commit()
			}
		case <-tick:
			commit()
		case <-retry.C:
			commit()
		}
	}
}

// commit commits every watermark of g that moved since the last commit.
func (s *Source) commit(g *generation) error {
	var offsets map[string]map[int]int64
	epochs := make([]int, len(g.parts))
	for i, p := range g.parts {
		off, epoch, ok := p.toCommit()
		if !ok {
			continue
		}
		epochs[i] = epoch
		if offsets == nil {
			offsets = make(map[string]map[int]int64)
		}
		if offsets[p.topic] == nil {
			offsets[p.topic] = make(map[int]int64)
		}
		offsets[p.topic][p.id] = off
	}
	if offsets == nil {
		return nil
	}
	if err := g.kg.CommitOffsets(offsets); err != nil {
		return err
	}
	for i, p := range g.parts {
		if off, ok := offsets[p.topic][p.id]; ok {
			p.committedTo(off, epochs[i])
		}
	}
	return nil
}

// watchPartitions ends the generation when the number of partitions of a
// topic changes (a topic created, partitions added), so that the group
// rebalances onto them. Errors only delay the next look.
func (s *Source) watchPartitions(gctx context.Context) {
	var conn *kafkago.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	t := time.NewTicker(s.cfg.PartitionWatchInterval)
	defer t.Stop()
	// The baseline was read before this generation was joined, so it is no
	// newer than what the group leader assigned from: a change in between
	// costs at most one extra rebalance, never a missed one.
	base := s.knownCounts()
	for attempt := 0; ; attempt++ {
		counts, err := s.partitionCounts(gctx, &conn, attempt)
		if err == nil {
			s.setKnownCounts(counts)
		}
		switch {
		case err != nil:
			s.log.Debug("kafka: partition watch failed", slog.Any("error", err))
		case base == nil:
			base = counts
		default:
			for topic, n := range counts {
				if n != base[topic] {
					s.log.Info("kafka: partitions changed; rebalancing", slog.String("topic", topic),
						slog.Int("was", base[topic]), slog.Int("now", n))
					return
				}
			}
		}
		select {
		case <-gctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Source) knownCounts() map[string]int {
	s.countsMu.Lock()
	defer s.countsMu.Unlock()
	return s.counts
}

func (s *Source) setKnownCounts(counts map[string]int) {
	s.countsMu.Lock()
	s.counts = counts
	s.countsMu.Unlock()
}

// partitionCounts returns how many partitions each topic has (0: missing),
// dialling a seed broker into *conn when it is nil.
func (s *Source) partitionCounts(ctx context.Context, conn **kafkago.Conn, attempt int) (map[string]int, error) {
	if *conn == nil {
		c, err := s.dialer.DialContext(ctx, "tcp", s.cfg.Brokers[attempt%len(s.cfg.Brokers)])
		if err != nil {
			return nil, err
		}
		*conn = c
	}
	c := *conn
	stop := context.AfterFunc(ctx, func() { c.Close() }) // Conn's calls take no context
	defer stop()
	counts := make(map[string]int, len(s.cfg.Topics))
	for _, topic := range s.cfg.Topics {
		err := c.SetDeadline(time.Now().Add(s.cfg.RequestTimeout))
		var parts []kafkago.Partition
		if err == nil {
			parts, err = c.ReadPartitions(topic)
		}
		if err != nil && !errors.Is(err, kafkago.UnknownTopicOrPartition) {
			c.Close()
			*conn = nil
			return nil, err
		}
		counts[topic] = len(parts)
	}
	return counts, nil
}

// startOffsets asks Config.StartOffsets where topic's partitions start. A
// failure is logged and the group's offsets are used: the consumer skips
// what lies below the store's offsets anyway, this only spares fetching it.
func (s *Source) startOffsets(ctx context.Context, topic string, assignments []kafkago.PartitionAssignment) map[int32]int64 {
	if s.cfg.StartOffsets == nil || len(assignments) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	stored, err := s.cfg.StartOffsets.StartOffsets(ctx, topic)
	if err != nil {
		s.log.Warn("kafka: StartOffsets failed; starting from the group's offsets", slog.String("topic", topic), slog.Any("error", err))
		return nil
	}
	return stored
}
