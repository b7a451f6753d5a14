package kafka

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/fetch"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
	"github.com/segmentio/kafka-go/protocol/saslauthenticate"
	"github.com/segmentio/kafka-go/protocol/saslhandshake"
	"github.com/segmentio/kafka-go/sasl"
)

// The fetch path speaks kafka-go's protocol package instead of using its
// Conn: a Conn's batches hand out transaction markers as messages and drop
// what reading committed needs, the batches' attributes and producer IDs
// and the fetch response's aborted transactions (kafka-go #1332, #1446).
// The protocol package decodes all of them. Its connection setup (TLS, API
// versions, SASL) is kafka-go's Transport's, which does not let a caller
// own and close one connection; it is repeated here for the fetchers, which
// do.

// Isolation levels of Fetch and ListOffsets requests.
const (
	readUncommitted int8 = 0
	readCommitted   int8 = 1
)

// Control record types (the key of a transaction marker).
const controlAbort = 0

// dialLeader connects to p's leader, asking the seed brokers in turn where
// it is. The look-up is bounded by DialTimeout and RequestTimeout.
func (s *Source) dialLeader(ctx context.Context, p *partition, attempt int) (*protocol.Conn, error) {
	var errs []error
	n := len(s.cfg.Brokers)
	for i := range n {
		seed := s.cfg.Brokers[(attempt+i)%n]
		lctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout+s.cfg.RequestTimeout)
		leader, err := s.dialer.LookupLeader(lctx, "tcp", seed, p.topic, p.id)
		cancel()
		if err == nil {
			var c *protocol.Conn
			addr := net.JoinHostPort(leader.Host, strconv.Itoa(leader.Port))
			if c, err = s.dialBroker(ctx, addr); err == nil {
				return c, nil
			}
			err = fmt.Errorf("leader %s: %w", addr, err)
		}
		errs = append(errs, fmt.Errorf("via %s: %w", seed, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// dialBroker opens a connection to addr as kafka-go's Transport does: TCP,
// TLS when configured, API version negotiation, SASL when configured; all
// within DialTimeout.
func (s *Source) dialBroker(ctx context.Context, addr string) (_ *protocol.Conn, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	raw, err := (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			raw.Close()
		}
	}()
	stop := context.AfterFunc(ctx, func() { raw.Close() }) // interrupts what follows
	defer stop()
	deadline, _ := ctx.Deadline()
	if err := raw.SetDeadline(deadline); err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(addr)
	nc := raw
	if cfg := s.cfg.TLS; cfg != nil {
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName = host
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		nc = tc
	}
	pc := protocol.NewConn(nc, s.cfg.ClientID)
	r, err := pc.RoundTrip(new(apiversions.Request))
	if err != nil {
		return nil, fmt.Errorf("api versions: %w", err)
	}
	res := r.(*apiversions.Response)
	if res.ErrorCode != 0 {
		return nil, fmt.Errorf("api versions: %w", kafkago.Error(res.ErrorCode))
	}
	versions := make(map[protocol.ApiKey]int16, len(res.ApiKeys))
	for _, k := range res.ApiKeys {
		key := protocol.ApiKey(k.ApiKey)
		versions[key] = key.SelectVersion(k.MinVersion, k.MaxVersion)
	}
	// Isolation levels, and with them transactions, came with Fetch v4 and
	// ListOffsets v2 (Kafka 0.11).
	if v, ok := versions[protocol.Fetch]; !ok || v < 4 {
		return nil, fmt.Errorf("broker %s does not support Fetch v4 (Kafka 0.11), which reading transactional topics needs", addr)
	}
	if v, ok := versions[protocol.ListOffsets]; !ok || v < 2 {
		return nil, fmt.Errorf("broker %s does not support ListOffsets v2 (Kafka 0.11)", addr)
	}
	pc.SetVersions(versions)
	if s.cfg.SASL != nil {
		p, _ := strconv.Atoi(port)
		if err := authenticate(sasl.WithMetadata(ctx, &sasl.Metadata{Host: host, Port: p}), pc, s.cfg.SASL); err != nil {
			return nil, fmt.Errorf("sasl %s: %w", s.cfg.SASL.Name(), err)
		}
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return pc, nil
}

// authenticate runs a SASL exchange on pc (SaslHandshake v1, then
// SaslAuthenticate until the mechanism is done), as kafka-go's Transport
// does.
func authenticate(ctx context.Context, pc *protocol.Conn, mech sasl.Mechanism) error {
	r, err := pc.RoundTrip(&saslhandshake.Request{Mechanism: mech.Name()})
	if err != nil {
		return err
	}
	if code := r.(*saslhandshake.Response).ErrorCode; code != 0 {
		return kafkago.Error(code)
	}
	sess, state, err := mech.Start(ctx)
	if err != nil {
		return err
	}
	for done := false; !done; {
		r, err := pc.RoundTrip(&saslauthenticate.Request{AuthBytes: state})
		if err != nil {
			if errors.Is(err, io.EOF) {
				// A broker may end a failed exchange by closing the connection.
				return kafkago.SASLAuthenticationFailed
			}
			return err
		}
		res := r.(*saslauthenticate.Response)
		if res.ErrorCode != 0 {
			return fmt.Errorf("%w: %s", kafkago.Error(res.ErrorCode), res.ErrorMessage)
		}
		if done, state, err = sess.Next(ctx, res.AuthBytes); err != nil {
			return err
		}
	}
	return nil
}

// fetched is the answer of one fetch request for one partition.
type fetched struct {
	highWatermark    int64
	lastStableOffset int64                       // -1 when the broker did not say
	aborted          []fetch.ResponseTransaction // transactions aborted in the range returned, by first offset
	batches          []protocol.RecordReader     // *protocol.RecordBatch, *protocol.ControlBatch or *protocol.MessageSet
}

// fetchOnce sends one fetch request for p at offset and decodes the answer.
// The caller sets pc's deadline.
func (s *Source) fetchOnce(pc *protocol.Conn, p *partition, offset int64, maxWait time.Duration, minBytes, maxBytes int) (*fetched, error) {
	r, err := pc.RoundTrip(&fetch.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(maxWait.Milliseconds()),
		MinBytes:       int32(minBytes),
		MaxBytes:       int32(maxBytes),
		IsolationLevel: s.isolation(),
		SessionEpoch:   -1, // a full fetch outside any fetch session
		Topics: []fetch.RequestTopic{{
			Topic: p.topic,
			Partitions: []fetch.RequestPartition{{
				Partition:          int32(p.id),
				CurrentLeaderEpoch: -1,
				FetchOffset:        offset,
				LogStartOffset:     -1,
				PartitionMaxBytes:  int32(maxBytes),
			}},
		}},
	})
	if err != nil {
		return nil, err
	}
	res := r.(*fetch.Response)
	if res.ErrorCode != 0 {
		return nil, kafkago.Error(res.ErrorCode)
	}
	if len(res.Topics) != 1 || len(res.Topics[0].Partitions) != 1 || res.Topics[0].Partitions[0].Partition != int32(p.id) {
		return nil, fmt.Errorf("fetch %s: the response is not for the partition requested", p.lane)
	}
	rp := &res.Topics[0].Partitions[0]
	if rp.ErrorCode != 0 {
		return nil, kafkago.Error(rp.ErrorCode)
	}
	f := &fetched{highWatermark: rp.HighWatermark, lastStableOffset: rp.LastStableOffset, aborted: rp.AbortedTransactions}
	slices.SortFunc(f.aborted, func(a, b fetch.ResponseTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	switch rs := rp.RecordSet.Records.(type) {
	case nil:
	case *protocol.RecordStream:
		f.batches = rs.Records
	default:
		f.batches = []protocol.RecordReader{rs}
	}
	return f, nil
}

// listOffset returns the first (kafkago.FirstOffset) or next (kafkago.LastOffset) offset of
// p's log; next is the last stable offset when reading committed.
func (s *Source) listOffset(pc *protocol.Conn, p *partition, which int64) (int64, error) {
	r, err := pc.RoundTrip(&listoffsets.Request{
		ReplicaID:      -1,
		IsolationLevel: s.isolation(),
		Topics: []listoffsets.RequestTopic{{
			Topic:      p.topic,
			Partitions: []listoffsets.RequestPartition{{Partition: int32(p.id), CurrentLeaderEpoch: -1, Timestamp: which}},
		}},
	})
	if err != nil {
		return 0, err
	}
	res := r.(*listoffsets.Response)
	if len(res.Topics) != 1 || len(res.Topics[0].Partitions) != 1 {
		return 0, fmt.Errorf("list offsets %s: the response is not for the partition requested", p.lane)
	}
	rp := res.Topics[0].Partitions[0]
	if rp.ErrorCode != 0 {
		return 0, kafkago.Error(rp.ErrorCode)
	}
	return rp.Offset, nil
}

func (s *Source) isolation() int8 {
	if s.cfg.ReadUncommitted {
		return readUncommitted
	}
	return readCommitted
}
