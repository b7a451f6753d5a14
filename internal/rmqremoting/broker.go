package rmqremoting

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// Queue names a queue of a topic on a broker: the broker's name and its
// master's address, the topic and the queue ID.
type Queue struct {
	Addr, Broker string
	Topic        string
	ID           int
}

func (q Queue) String() string { return q.Topic + "/" + q.Broker + "/" + strconv.Itoa(q.ID) }

func (q Queue) ext(more ...string) map[string]string {
	m := map[string]string{"topic": q.Topic, "queueId": strconv.Itoa(q.ID), "bname": q.Broker}
	for i := 0; i+1 < len(more); i += 2 {
		m[more[i]] = more[i+1]
	}
	return m
}

func offsetOf(resp *Response) (int64, error) {
	off, err := strconv.ParseInt(resp.Ext["offset"], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("rocketmq: offset %q in the answer: %w", resp.Ext["offset"], err)
	}
	return off, nil
}

// MaxOffset returns the offset after the last message of q.
func MaxOffset(ctx context.Context, q Queue) (int64, error) {
	resp, err := call(ctx, q.Addr, ReqGetMaxOffset, q.ext(), nil)
	if err != nil {
		return 0, fmt.Errorf("max offset of %s: %w", q, err)
	}
	return offsetOf(resp)
}

// MinOffset returns the offset of the first message the broker still has in
// q.
func MinOffset(ctx context.Context, q Queue) (int64, error) {
	resp, err := call(ctx, q.Addr, ReqGetMinOffset, q.ext(), nil)
	if err != nil {
		return 0, fmt.Errorf("min offset of %s: %w", q, err)
	}
	return offsetOf(resp)
}

// ConsumerOffset returns group's committed offset of q (the offset of the
// next message to consume), and whether it has one. The broker may answer
// 0 for a group without one when the queue still holds its first message.
func ConsumerOffset(ctx context.Context, group string, q Queue) (int64, bool, error) {
	resp, err := call(ctx, q.Addr, ReqQueryConsumerOffset, q.ext("consumerGroup", group), nil, CodeQueryNotFound)
	if err != nil {
		return 0, false, fmt.Errorf("offset of group %s in %s: %w", group, q, err)
	}
	if resp.Code == CodeQueryNotFound {
		return 0, false, nil
	}
	off, err := offsetOf(resp)
	return off, err == nil, err
}

// CommitOffset commits off as group's offset of q and returns once the
// broker answered. A broker that does not know the group (RocketMQ 5
// refuses offsets of groups it has no subscription config for) gets it
// first, as a consumer's heartbeat would create it (CreateGroup).
func CommitOffset(ctx context.Context, group string, q Queue, off int64) error {
	ext := q.ext("consumerGroup", group, "commitOffset", strconv.FormatInt(off, 10))
	_, err := call(ctx, q.Addr, ReqUpdateConsumerOffset, ext, nil)
	if IsCode(err, CodeGroupNotExist) {
		if err = CreateGroup(ctx, q.Addr, group); err == nil {
			_, err = call(ctx, q.Addr, ReqUpdateConsumerOffset, ext, nil)
		}
	}
	if err != nil {
		return fmt.Errorf("commit offset %d of group %s in %s: %w", off, group, q, err)
	}
	return nil
}

// CreateGroup creates (or overwrites) group's subscription config on the
// broker at addr, with the broker's defaults.
func CreateGroup(ctx context.Context, addr, group string) error {
	body, err := json.Marshal(map[string]string{"groupName": group})
	if err != nil {
		return err
	}
	if _, err := call(ctx, addr, ReqUpdateSubGroup, nil, body); err != nil {
		return fmt.Errorf("create group %s on %s: %w", group, addr, err)
	}
	return nil
}

// PullStatus is what a pull found.
type PullStatus int

// The statuses of a pull.
const (
	PullFound       PullStatus = iota // messages
	PullNoNew                         // nothing at the offset yet
	PullRetry                         // nothing matched; pull from NextBegin
	PullOffsetMoved                   // the offset is not in the queue (deleted, or past its end)
)

// PullResult is a pull's answer.
type PullResult struct {
	Status     PullStatus
	NextBegin  int64 // where the next pull starts
	Min, Max   int64 // the queue's offsets
	Messages   []*primitive.MessageExt
	SuggestsID int64 // the broker ID to pull from next (a slave, when the master is busy)
}

// Pull reads up to max messages of q from offset, as group, without a
// subscription registered (the broker takes "*" from the request), without
// waiting for messages that are not there yet, and without committing an
// offset. The messages' Queue is q.
func Pull(ctx context.Context, group string, q Queue, offset int64, max int) (PullResult, error) {
	const flagSubscription = 1 << 2
	ext := q.ext("consumerGroup", group, "queueOffset", strconv.FormatInt(offset, 10),
		"maxMsgNums", strconv.Itoa(max), "sysFlag", strconv.Itoa(flagSubscription), "commitOffset", "0",
		"suspendTimeoutMillis", "0", "subscription", "*", "subVersion", "0", "expressionType", "TAG")
	resp, err := call(ctx, q.Addr, ReqPullMessage, ext, nil, CodePullNotFound, CodePullRetryImmediately, CodePullOffsetMoved)
	if err != nil {
		return PullResult{}, fmt.Errorf("pull %s at %d: %w", q, offset, err)
	}
	var r PullResult
	for name, p := range map[string]*int64{"nextBeginOffset": &r.NextBegin, "minOffset": &r.Min, "maxOffset": &r.Max, "suggestWhichBrokerId": &r.SuggestsID} {
		if v, ok := resp.Ext[name]; ok {
			if *p, err = strconv.ParseInt(v, 10, 64); err != nil {
				return PullResult{}, fmt.Errorf("pull %s at %d: %s %q: %w", q, offset, name, v, err)
			}
		}
	}
	switch resp.Code {
	case CodeSuccess:
		r.Status = PullFound
		r.Messages = primitive.DecodeMessage(resp.Body)
		for _, m := range r.Messages {
			m.Queue = &primitive.MessageQueue{Topic: q.Topic, BrokerName: q.Broker, QueueId: q.ID}
		}
	case CodePullNotFound:
		r.Status = PullNoNew
	case CodePullRetryImmediately:
		r.Status = PullRetry
	case CodePullOffsetMoved:
		r.Status = PullOffsetMoved
	}
	return r, nil
}
