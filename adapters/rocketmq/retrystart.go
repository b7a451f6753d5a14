package rocketmq

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemkit/idem/internal/rmqremoting"
)

// A retry topic starts at its first message, whatever Config.StartFrom
// says. Every copy in <topic>_RETRY stands for an original that was
// acknowledged once the copy was stored; a queue of it has no committed
// offset until a copy of it is consumed and its offset persisted (every
// 5 s), and the push consumer has one ConsumeFromWhere for all its topics.
// With LastOffset, a member started in that window (a deploy, a crash)
// would begin at the queue's end and skip the copies there for good.
// (RocketMQ 5.3 answers a group without an offset with 0 while the
// queue's first message is at offset 0 and in the page cache, which
// narrows the window to a retry queue whose first copies were deleted by
// retention or left the cache — which the test environment cannot reach.
// Nothing is shown failing there; the rule is Kafka's, shown on Kafka.) So
// before the push consumer starts, Run commits the first offset of every
// retry queue the group has no offset for (seedRetryOffsets): the
// consumer then starts there as from any committed offset.

// seedRetryOffsets commits, for each queue of topics (the retry topics)
// where the group has no committed offset, the queue's first offset. It
// is best effort: a queue it cannot read or write is logged and left to
// StartFrom. Without name servers it can reach unsigned (AccessKey set),
// it logs that it cannot and does nothing.
func (s *Source) seedRetryOffsets(ctx context.Context, topics []string) {
	if s.cfg.StartFrom != LastOffset || len(topics) == 0 {
		return
	}
	if s.cfg.AccessKey != "" {
		s.log.Warn("rocketmq: StartFrom LastOffset with retry topics and credentials: the retry topics' first offsets cannot be committed "+
			"before the start (the admin requests are not signed); a member started before a retry queue's first copy is consumed starts at its end",
			slog.Any("retry_topics", topics))
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	readQueues(ctx, s.cfg.NameServers, topics, func(topic string, err error) {
		s.log.Warn("rocketmq: cannot read a retry topic's route to start it at its first message", slog.String("topic", topic), slog.Any("error", err))
	}, func(q rmqremoting.Queue) {
		if err := seedQueue(ctx, s.cfg.Group, q); err != nil {
			s.log.Warn("rocketmq: cannot start a retry queue at its first message", slog.String("queue", q.String()), slog.Any("error", err))
		}
	})
}

// seedQueue commits q's first offset for group unless group has one.
func seedQueue(ctx context.Context, group string, q rmqremoting.Queue) error {
	_, ok, err := rmqremoting.ConsumerOffset(ctx, group, q)
	if err != nil || ok {
		return err
	}
	first, err := rmqremoting.MinOffset(ctx, q)
	if err != nil {
		return err
	}
	return rmqremoting.CommitOffset(ctx, group, q, first)
}
