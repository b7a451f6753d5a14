// Package rmqremoting speaks the few requests of RocketMQ's remoting
// protocol that idem needs answered synchronously and that
// rocketmq-client-go does not expose: a topic's route, the brokers of a
// cluster, a queue's offsets, a consumer group's committed offset (read and
// written with an answer: the client commits one-way and drops errors), and
// a pull from a chosen offset without a consumer running. `idem redrive`
// reads RocketMQ dead-letter topics with it, and the tests' rmqtest
// inspects brokers with it.
//
// Each call opens a connection of its own, sends one request and reads its
// answer; ctx bounds both. There is no ACL signing: a cluster with ACL
// enabled refuses these requests (an *Error with the broker's code).
package rmqremoting

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// Request and response codes (org.apache.rocketmq.remoting.protocol
// RequestCode and ResponseCode).
const (
	ReqPullMessage          = 11
	ReqQueryConsumerOffset  = 14
	ReqUpdateConsumerOffset = 15
	ReqGetMaxOffset         = 30
	ReqGetMinOffset         = 31
	ReqGetRouteInfoByTopic  = 105
	ReqGetBrokerClusterInfo = 106
	ReqUpdateSubGroup       = 200

	CodeSuccess               = 0
	CodeSystemError           = 1
	CodeRequestNotSupported   = 3
	CodeTopicNotExist         = 17
	CodePullNotFound          = 19
	CodePullRetryImmediately  = 20
	CodePullOffsetMoved       = 21
	CodeQueryNotFound         = 22
	CodeSubscriptionNotExist  = 24
	CodeSubscriptionNotLatest = 25
	CodeGroupNotExist         = 26
)

// DefaultTimeout bounds a call whose context has no deadline.
const DefaultTimeout = 10 * time.Second

// maxFrame bounds an answer: a pull of 32 messages of at most 4 MiB each,
// with room.
const maxFrame = 256 << 20

// Response is a server's answer.
type Response struct {
	Code   int
	Remark string
	Ext    map[string]string
	Body   []byte
}

// Error is a server's answer with a code the call does not expect.
type Error struct {
	Addr    string
	Request int
	Code    int
	Remark  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("rocketmq %s: request %d: code %d: %s", e.Addr, e.Request, e.Code, e.Remark)
}

// IsCode reports whether err is an *Error with code.
func IsCode(err error, code int) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// ErrNotRemoting is returned when what answered at the address did not
// answer with a frame of RocketMQ's remoting protocol: another server (a
// Kafka broker closes the connection), or none.
var ErrNotRemoting = errors.New("not a RocketMQ remoting answer")

var opaque atomic.Int32

// Call sends one request to addr on a connection of its own and returns the
// answer, whatever its code. Errors are the connection's, or ErrNotRemoting
// (wrapped) when the answer is not a remoting frame.
func Call(ctx context.Context, addr string, code int, ext map[string]string, body []byte) (*Response, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	op := opaque.Add(1)
	header, err := json.Marshal(map[string]any{"code": code, "language": "GO", "version": 317, "opaque": op, "flag": 0, "extFields": ext})
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	frame := make([]byte, 8, 8+len(header)+len(body))
	binary.BigEndian.PutUint32(frame[0:], uint32(4+len(header)+len(body)))
	binary.BigEndian.PutUint32(frame[4:], uint32(len(header))) // serialize type 0: JSON
	if _, err := conn.Write(append(append(frame, header...), body...)); err != nil {
		return nil, ctxErr(ctx, err)
	}
	var head [8]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			return nil, fmt.Errorf("%w: %s closed the connection", ErrNotRemoting, addr)
		}
		return nil, ctxErr(ctx, err)
	}
	length := binary.BigEndian.Uint32(head[0:])
	kind, hlen := head[4], binary.BigEndian.Uint32(head[4:])&0xFFFFFF
	if kind != 0 || length < 4+hlen || length > maxFrame {
		return nil, fmt.Errorf("%w: %s sent a frame of length %d, header %d, type %d", ErrNotRemoting, addr, length, hlen, kind)
	}
	rest := make([]byte, length-4)
	if _, err := io.ReadFull(conn, rest); err != nil {
		return nil, ctxErr(ctx, err)
	}
	var resp struct {
		Code      int               `json:"code"`
		Opaque    int32             `json:"opaque"`
		Remark    string            `json:"remark"`
		ExtFields map[string]string `json:"extFields"`
	}
	if err := json.Unmarshal(rest[:hlen], &resp); err != nil {
		return nil, fmt.Errorf("%w: %s: header: %v", ErrNotRemoting, addr, err)
	}
	if resp.Opaque != op {
		return nil, fmt.Errorf("%w: %s answered request %d with %d", ErrNotRemoting, addr, op, resp.Opaque)
	}
	return &Response{Code: resp.Code, Remark: resp.Remark, Ext: resp.ExtFields, Body: rest[hlen:]}, nil
}

// ctxErr names the context's end as the cause of a connection's error:
// the connection's deadline is the context's.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	}
	return err
}

// call is Call that turns any code but the accepted ones into an *Error.
func call(ctx context.Context, addr string, code int, ext map[string]string, body []byte, accept ...int) (*Response, error) {
	resp, err := Call(ctx, addr, code, ext, body)
	if err != nil {
		return nil, err
	}
	if resp.Code == CodeSuccess {
		return resp, nil
	}
	for _, c := range accept {
		if resp.Code == c {
			return resp, nil
		}
	}
	return nil, &Error{Addr: addr, Request: code, Code: resp.Code, Remark: resp.Remark}
}
