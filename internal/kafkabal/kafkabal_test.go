package kafkabal

import (
	"testing"

	kafkago "github.com/segmentio/kafka-go"
)

func TestSamePartition(t *testing.T) {
	for _, c := range []struct {
		partition  int
		partitions []int
		want       int
	}{
		{partition: 2, partitions: []int{0, 1, 2, 3}, want: 2},
		{partition: 5, partitions: []int{0, 1, 2}, want: 2},
		{partition: -1, partitions: []int{4, 5}, want: 4},
		{partition: 3, partitions: nil, want: 0},
	} {
		got := SamePartition{}.Balance(kafkago.Message{Partition: c.partition}, c.partitions...)
		if got != c.want {
			t.Errorf("partition %d of %v: got %d, want %d", c.partition, c.partitions, got, c.want)
		}
	}
}
