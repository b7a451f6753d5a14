package main

// The peer rows: what a Go team picks instead of idem for the same job,
// on the same topic and the same durable Postgres, each message in its own
// transaction:
//
//	BEGIN; INSERT INTO dedup (key) VALUES ($1) ON CONFLICT DO NOTHING;
//	INSERT INTO effects (txn_id, amount) VALUES ($1, $2) -- when the key was new
//	COMMIT; then the offset is marked
//
//	watermill        Watermill's router (v1.5) over watermill-kafka's Sarama
//	                 subscriber (v3), its defaults: one message in flight per
//	                 partition, acknowledged when the handler returns; a pgx
//	                 pool of its default size (max(4, cores) connections)
//	watermill-tuned  the same with the pool raised to -peer-conns (10)
//	                 connections
//	sarama           a plain IBM/sarama ConsumerGroup, one ConsumeClaim loop
//	                 per partition, the same transaction per message, on a
//	                 pool of -peer-conns connections
//
// The Sarama clients start at the oldest offset (the topic is prefilled)
// and speak Kafka 2.1's protocol, the oldest Kafka 4 accepts (watermill's
// default config asks for 1.0). Offsets are committed as Sarama does by
// default: marked after the transaction, committed once a second.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

var peerRows = []string{"watermill", "watermill-tuned", "sarama"}

// peerTx is the peers' handler: one transaction that claims the key with
// ON CONFLICT DO NOTHING and writes the business row when it was new.
type peerTx struct {
	pool                *pgxpool.Pool
	claimSQL, effectSQL string
}

// newPeerTx opens the row's pool; runRow closes it after the row's last
// CPU snapshot, so that its connections' server processes are still there
// to be read.
func newPeerTx(ctx context.Context, e *env, conns int, sc string) (*peerTx, error) {
	cfg, err := pgxpool.ParseConfig(e.pgURL)
	if err != nil {
		return nil, err
	}
	if conns > 0 {
		cfg.MaxConns = int32(conns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	e.afterRow = append(e.afterRow, pool.Close)
	p := &peerTx{pool: pool,
		claimSQL:  `INSERT INTO ` + sc + `.dedup (key) VALUES ($1) ON CONFLICT DO NOTHING`,
		effectSQL: `INSERT INTO ` + sc + `.effects (txn_id, amount) VALUES ($1, $2)`}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+sc+`.dedup (key text PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *peerTx) handle(ctx context.Context, value []byte) error {
	var m struct {
		TxnID  string `json:"txn_id"`
		Amount int64  `json:"amount"`
	}
	if err := json.Unmarshal(value, &m); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, p.claimSQL, m.TxnID)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		_, err = tx.Exec(ctx, p.effectSQL, m.TxnID, m.Amount)
		return err
	})
}

// saramaConfig is Sarama's default consumer config, reading the prefilled
// topic from its start, in the protocol of Kafka 2.1.
func saramaConfig(base *sarama.Config) *sarama.Config {
	base.Version = sarama.V2_1_0_0
	base.Consumer.Offsets.Initial = sarama.OffsetOldest
	return base
}

// peerCount counts the messages a peer row has committed and closes done
// when n of them have.
type peerCount struct {
	n, done int64
	count   atomic.Int64
	reached chan struct{}
}

func newPeerCount(n int) *peerCount {
	return &peerCount{n: int64(n), reached: make(chan struct{})}
}

func (c *peerCount) add() {
	if c.count.Add(1) == c.n {
		close(c.reached)
	}
}

// wait waits until n messages are committed or fail ends the row; no
// progress for stall fails it.
func (c *peerCount) wait(ctx context.Context, fail <-chan error, stall time.Duration) error {
	last, progress := int64(0), time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-c.reached:
			return nil
		case err := <-fail:
			return errors.Join(errors.New("peer stopped early"), err)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if v := c.count.Load(); v != last {
			last, progress = v, time.Now()
		} else if time.Since(progress) > stall {
			return fmt.Errorf("stalled: %d of %d messages committed, none for %v", v, c.n, stall)
		}
	}
}

const peerStall = 60 * time.Second

func runWatermill(ctx context.Context, e *env, group string, n int, sc string, conns int, lat *latencies) error {
	p, err := newPeerTx(ctx, e, conns, sc)
	if err != nil {
		return err
	}
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers:               e.brokers,
		Unmarshaler:           wmkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: saramaConfig(wmkafka.DefaultSaramaSubscriberConfig()),
		ConsumerGroup:         group,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	count := newPeerCount(n)
	router.AddConsumerHandler("bench", e.topic, sub, func(msg *message.Message) error {
		t := time.Now()
		if err := p.handle(msg.Context(), msg.Payload); err != nil {
			return err // nacked: redelivered
		}
		lat.since(msg.Payload, t)
		count.add()
		return nil
	})
	fail := make(chan error, 1)
	go func() { fail <- router.Run(ctx) }()
	err = count.wait(ctx, fail, peerStall)
	return errors.Join(err, router.Close(), sub.Close())
}

func runSarama(ctx context.Context, e *env, group string, n int, sc string, conns int, lat *latencies) error {
	p, err := newPeerTx(ctx, e, conns, sc)
	if err != nil {
		return err
	}
	cg, err := sarama.NewConsumerGroup(e.brokers, group, saramaConfig(sarama.NewConfig()))
	if err != nil {
		return err
	}
	count := newPeerCount(n)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	fail := make(chan error, 1)
	go func() {
		h := saramaHandler{p: p, count: count, lat: lat}
		for runCtx.Err() == nil {
			if err := cg.Consume(runCtx, []string{e.topic}, h); err != nil && runCtx.Err() == nil {
				fail <- err
				return
			}
		}
		fail <- nil
	}()
	err = count.wait(ctx, fail, peerStall)
	cancel()
	if err == nil {
		err = <-fail
	}
	return errors.Join(err, cg.Close())
}

// saramaHandler runs one transaction per message of each claimed
// partition, in offset order, and marks the message after it committed.
type saramaHandler struct {
	p     *peerTx
	count *peerCount
	lat   *latencies
}

func (saramaHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h saramaHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			t := time.Now()
			if err := h.p.handle(ctx, m.Value); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			sess.MarkMessage(m, "")
			h.lat.since(m.Value, t)
			h.count.add()
		case <-ctx.Done():
			return nil
		}
	}
}
