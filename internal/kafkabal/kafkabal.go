// Package kafkabal holds the kafka-go balancer that the Kafka adapter's
// dead letters and retries and idem redrive's resends share.
package kafkabal

import kafkago "github.com/segmentio/kafka-go"

// SamePartition routes a record to the partition numbered like the
// record's Partition field (the original's partition), modulo the topic's
// partitions, so that the records of one partition stay in order.
type SamePartition struct{}

// Balance implements kafkago.Balancer.
func (SamePartition) Balance(m kafkago.Message, partitions ...int) int {
	if len(partitions) == 0 {
		return 0
	}
	i := m.Partition % len(partitions)
	if i < 0 {
		i = 0
	}
	return partitions[i]
}
