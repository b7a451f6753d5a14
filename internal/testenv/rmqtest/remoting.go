package rmqtest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The broker's remoting protocol, for offsets. mqadmin answers in seconds
// (a JVM per call); offsets are small requests of RocketMQ's remoting
// protocol: a frame of length, header length, a JSON header and a body.

const (
	reqQueryConsumerOffset  = 14
	reqUpdateConsumerOffset = 15
	reqUpdateSubGroup       = 200
	reqGetMaxOffset         = 30
	reqGetMinOffset         = 31
	reqGetBrokerClusterInfo = 106
	respQueryNotFound       = 22
)

var opaque struct {
	sync.Mutex
	n int32
}

// remoting sends one request to addr and returns the response's code,
// extFields and body.
func remoting(addr string, code int, ext map[string]string) (int, map[string]string, []byte, error) {
	return remotingBody(addr, code, ext, nil)
}

// remotingBody is remoting with a request body.
func remotingBody(addr string, code int, ext map[string]string, body []byte) (int, map[string]string, []byte, error) {
	opaque.Lock()
	opaque.n++
	op := opaque.n
	opaque.Unlock()
	header, err := json.Marshal(map[string]any{"code": code, "language": "GO", "version": 317, "opaque": op, "flag": 0, "extFields": ext})
	if err != nil {
		return 0, nil, nil, err
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, nil, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	frame := make([]byte, 8, 8+len(header)+len(body))
	binary.BigEndian.PutUint32(frame[0:], uint32(4+len(header)+len(body)))
	binary.BigEndian.PutUint32(frame[4:], uint32(len(header))) // serialize type 0: JSON
	if _, err := conn.Write(append(append(frame, header...), body...)); err != nil {
		return 0, nil, nil, err
	}
	var head [8]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		return 0, nil, nil, err
	}
	length := binary.BigEndian.Uint32(head[0:])
	hlen := binary.BigEndian.Uint32(head[4:]) & 0xFFFFFF
	if length < 4+hlen || length > 64<<20 {
		return 0, nil, nil, fmt.Errorf("remoting: bad frame (%d, %d)", length, hlen)
	}
	rest := make([]byte, length-4)
	if _, err := io.ReadFull(conn, rest); err != nil {
		return 0, nil, nil, err
	}
	var resp struct {
		Code      int               `json:"code"`
		Remark    string            `json:"remark"`
		ExtFields map[string]string `json:"extFields"`
	}
	if err := json.Unmarshal(rest[:hlen], &resp); err != nil {
		return 0, nil, nil, fmt.Errorf("remoting: header: %w", err)
	}
	if resp.Code != 0 && resp.Code != respQueryNotFound {
		return resp.Code, nil, nil, fmt.Errorf("remoting: request %d: code %d: %s", code, resp.Code, resp.Remark)
	}
	return resp.Code, resp.ExtFields, rest[hlen:], nil
}

func (b *Broker) offsetRequest(code int, ext map[string]string) (int64, bool, error) {
	rc, fields, _, err := remoting(b.Addr, code, ext)
	if err != nil {
		return 0, false, err
	}
	if rc == respQueryNotFound {
		return 0, false, nil
	}
	off, err := strconv.ParseInt(fields["offset"], 10, 64)
	return off, err == nil, err
}

// MaxOffset returns the offset after the last message of queue q of topic.
func (b *Broker) MaxOffset(topic string, q int) (int64, error) {
	off, _, err := b.offsetRequest(reqGetMaxOffset, map[string]string{"topic": topic, "queueId": strconv.Itoa(q), "bname": b.Name})
	return off, err
}

// MinOffset returns the offset of the first message the broker still has
// in queue q of topic.
func (b *Broker) MinOffset(topic string, q int) (int64, error) {
	off, _, err := b.offsetRequest(reqGetMinOffset, map[string]string{"topic": topic, "queueId": strconv.Itoa(q), "bname": b.Name})
	return off, err
}

// ConsumerOffset returns group's committed offset of queue q of topic, and
// whether it has one.
func (b *Broker) ConsumerOffset(group, topic string, q int) (int64, bool, error) {
	return b.offsetRequest(reqQueryConsumerOffset, map[string]string{"consumerGroup": group, "topic": topic,
		"queueId": strconv.Itoa(q), "bname": b.Name})
}

// CommitOffset creates group's subscription on the broker if need be and
// commits off as its offset of queue q of topic, as a consumer would.
func (b *Broker) CommitOffset(group, topic string, q int, off int64) error {
	if _, _, _, err := remotingBody(b.Addr, reqUpdateSubGroup, nil, []byte(`{"groupName":"`+group+`"}`)); err != nil {
		return fmt.Errorf("create group %s: %w", group, err)
	}
	_, _, _, err := remoting(b.Addr, reqUpdateConsumerOffset, map[string]string{"consumerGroup": group, "topic": topic,
		"queueId": strconv.Itoa(q), "commitOffset": strconv.FormatInt(off, 10), "bname": b.Name})
	return err
}

var brokerAddrRE = regexp.MustCompile(`"brokerName":"([^"]+)"[^}]*"brokerAddrs":\{"?0"?:"([^"]+)"`)
var brokerAddrRE2 = regexp.MustCompile(`"brokerAddrs":\{"?0"?:"([^"]+)"\}[^}]*"brokerName":"([^"]+)"`)

// ClusterBroker asks the name server for its master broker's address and
// name (one of them, when it has several). The body is fastjson, whose map
// keys may be unquoted numbers.
func ClusterBroker(namesrv string) (addr, name string, err error) {
	_, _, body, err := remoting(namesrv, reqGetBrokerClusterInfo, nil)
	if err != nil {
		return "", "", fmt.Errorf("broker cluster info from %s: %w", namesrv, err)
	}
	if m := brokerAddrRE.FindSubmatch(body); m != nil {
		return string(m[2]), string(m[1]), nil
	}
	if m := brokerAddrRE2.FindSubmatch(body); m != nil {
		return string(m[1]), string(m[2]), nil
	}
	return "", "", errors.New("the name server knows no master broker: " + string(body))
}

// Master is a master broker the name server knows.
type Master struct {
	Name, Addr string
}

// Masters asks the name server for all of its master brokers (those with a
// brokerId 0 address), sorted by name.
func Masters(namesrv string) ([]Master, error) {
	_, _, body, err := remoting(namesrv, reqGetBrokerClusterInfo, nil)
	if err != nil {
		return nil, fmt.Errorf("broker cluster info from %s: %w", namesrv, err)
	}
	byName := map[string]string{}
	for _, m := range brokerAddrRE.FindAllSubmatch(body, -1) {
		byName[string(m[1])] = string(m[2])
	}
	for _, m := range brokerAddrRE2.FindAllSubmatch(body, -1) {
		byName[string(m[2])] = string(m[1])
	}
	out := make([]Master, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, Master{Name: name, Addr: byName[name]})
	}
	return out, nil
}
