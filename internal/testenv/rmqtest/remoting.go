package rmqtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/rmqremoting"
)

// Offsets are small requests of RocketMQ's remoting protocol
// (internal/rmqremoting): mqadmin answers in seconds (a JVM per call).

// remotingTimeout bounds one request.
const remotingTimeout = 10 * time.Second

func (b *Broker) queue(topic string, q int) rmqremoting.Queue {
	return rmqremoting.Queue{Addr: b.Addr, Broker: b.Name, Topic: topic, ID: q}
}

// MaxOffset returns the offset after the last message of queue q of topic.
func (b *Broker) MaxOffset(topic string, q int) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), remotingTimeout)
	defer cancel()
	return rmqremoting.MaxOffset(ctx, b.queue(topic, q))
}

// MinOffset returns the offset of the first message the broker still has
// in queue q of topic.
func (b *Broker) MinOffset(topic string, q int) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), remotingTimeout)
	defer cancel()
	return rmqremoting.MinOffset(ctx, b.queue(topic, q))
}

// ConsumerOffset returns group's committed offset of queue q of topic, and
// whether it has one.
func (b *Broker) ConsumerOffset(group, topic string, q int) (int64, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), remotingTimeout)
	defer cancel()
	return rmqremoting.ConsumerOffset(ctx, group, b.queue(topic, q))
}

// CommitOffset creates group's subscription on the broker if need be and
// commits off as its offset of queue q of topic, as a consumer would.
func (b *Broker) CommitOffset(group, topic string, q int, off int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), remotingTimeout)
	defer cancel()
	return rmqremoting.CommitOffset(ctx, group, b.queue(topic, q), off)
}

// ClusterBroker asks the name server for its master broker's address and
// name (the first by name, when it has several).
func ClusterBroker(namesrv string) (addr, name string, err error) {
	masters, err := Masters(namesrv)
	if err != nil {
		return "", "", err
	}
	if len(masters) == 0 {
		return "", "", errors.New("the name server " + namesrv + " knows no master broker")
	}
	return masters[0].Addr, masters[0].Name, nil
}

// Master is a master broker the name server knows.
type Master = rmqremoting.Master

// Masters asks the name server for all of its master brokers (those with a
// brokerId 0 address), sorted by name.
func Masters(namesrv string) ([]Master, error) {
	ctx, cancel := context.WithTimeout(context.Background(), remotingTimeout)
	defer cancel()
	ms, err := rmqremoting.Masters(ctx, namesrv)
	if err != nil {
		return nil, fmt.Errorf("rmqtest: %w", err)
	}
	return ms, nil
}
