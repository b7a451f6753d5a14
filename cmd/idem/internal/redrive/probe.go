package redrive

import (
	"context"
	"errors"
	"fmt"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/internal/rmqremoting"
)

// WrongBrokerError says that an address given for one broker answers like
// another: a RocketMQ name server given as a Kafka broker, or the reverse.
// Run returns it when the first request failed and a probe in the other
// broker's protocol succeeded.
type WrongBrokerError struct {
	Addr  string
	Want  string // the Broker's Name: "kafka" or "rocketmq"
	Seems string // what answered: "a RocketMQ name server", "a RocketMQ broker", "a Kafka broker"
	Err   error  // the request that failed
}

func (e *WrongBrokerError) Error() string {
	want := map[string]string{"kafka": "a Kafka broker", "rocketmq": "a RocketMQ name server"}[e.Want]
	return fmt.Sprintf("%s: %s answers like %s, not %s (%v)", e.Want, e.Addr, e.Seems, want, e.Err)
}

func (e *WrongBrokerError) Unwrap() error { return e.Err }

// probeTimeout bounds a probe.
const probeTimeout = 3 * time.Second

// notKafka returns a *WrongBrokerError when the first of brokers, which
// failed a Kafka request with err, answers RocketMQ's remoting protocol;
// else err.
func notKafka(ctx context.Context, brokers []string, err error) error {
	if ctx.Err() != nil || len(brokers) == 0 {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	resp, perr := rmqremoting.Call(pctx, brokers[0], rmqremoting.ReqGetBrokerClusterInfo, nil, nil)
	switch {
	case perr != nil:
		return err
	case resp.Code == rmqremoting.CodeSuccess:
		return &WrongBrokerError{Addr: brokers[0], Want: "kafka", Seems: "a RocketMQ name server", Err: err}
	default:
		return &WrongBrokerError{Addr: brokers[0], Want: "kafka", Seems: "a RocketMQ broker", Err: err}
	}
}

// notRocketMQ returns a *WrongBrokerError when addr, which failed a
// RocketMQ request with err, answers Kafka's protocol; else nil.
func notRocketMQ(ctx context.Context, addr string, err error) error {
	if ctx.Err() != nil || errors.As(err, new(*rmqremoting.Error)) {
		return nil // it answered in RocketMQ's protocol
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	tr := &kafkago.Transport{DialTimeout: probeTimeout}
	defer tr.CloseIdleConnections()
	cl := &kafkago.Client{Addr: kafkago.TCP(addr), Timeout: probeTimeout, Transport: tr}
	if _, perr := cl.ApiVersions(pctx, &kafkago.ApiVersionsRequest{}); perr != nil {
		return nil
	}
	return &WrongBrokerError{Addr: addr, Want: "rocketmq", Seems: "a Kafka broker", Err: err}
}
