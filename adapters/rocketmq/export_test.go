package rocketmq

import (
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// TakeOnlyQueue makes s's push consumer take only queue id of each topic,
// whatever the group's members: the other queues are consumed by no one.
func TakeOnlyQueue(s *Source, id int) {
	s.allocate = func(_, _ string, all []*primitive.MessageQueue, _ []string) []*primitive.MessageQueue {
		var mine []*primitive.MessageQueue
		for _, mq := range all {
			if mq.QueueId == id {
				mine = append(mine, mq)
			}
		}
		return mine
	}
}

// SlowResults makes s's push consumer wait d after each consume call
// returned, before it records the call's offset.
func SlowResults(s *Source, d time.Duration) { s.slowResults = d }
