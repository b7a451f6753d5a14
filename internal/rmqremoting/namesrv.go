package rmqremoting

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrTopicNotExist is returned by TopicRoute for a topic the name server
// does not route.
var ErrTopicNotExist = errors.New("the topic does not exist")

// Master is a master broker: its name and address (brokerId 0).
type Master struct {
	Name, Addr string
}

// Masters asks the name server namesrv for the master brokers of every
// cluster it knows, sorted by name. A broker without a master (its master
// down, only slaves left) is left out.
func Masters(ctx context.Context, namesrv string) ([]Master, error) {
	resp, err := call(ctx, namesrv, ReqGetBrokerClusterInfo, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("broker cluster info from %s: %w", namesrv, err)
	}
	var info struct {
		BrokerAddrTable map[string]struct {
			BrokerName  string            `json:"brokerName"`
			BrokerAddrs map[string]string `json:"brokerAddrs"`
		} `json:"brokerAddrTable"`
	}
	if err := json.Unmarshal(fastJSON(resp.Body), &info); err != nil {
		return nil, fmt.Errorf("broker cluster info from %s: %w", namesrv, err)
	}
	var out []Master
	for name, b := range info.BrokerAddrTable {
		if b.BrokerName != "" {
			name = b.BrokerName
		}
		if addr := b.BrokerAddrs["0"]; addr != "" {
			out = append(out, Master{Name: name, Addr: addr})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RouteBroker is one broker of a topic's route: its name, its master's
// address ("" when the master is down) and the topic's queues on it.
type RouteBroker struct {
	Name        string
	Addr        string
	ReadQueues  int
	WriteQueues int
	Perm        int // 4 readable, 2 writable
}

// Readable reports whether the broker's queues of the topic may be read.
func (b RouteBroker) Readable() bool { return b.Perm&4 != 0 }

// TopicRoute asks the name server namesrv for topic's route: the brokers
// that hold it, sorted by name. ErrTopicNotExist (wrapped) when it routes
// no such topic.
func TopicRoute(ctx context.Context, namesrv, topic string) ([]RouteBroker, error) {
	resp, err := call(ctx, namesrv, ReqGetRouteInfoByTopic, map[string]string{"topic": topic}, nil)
	if IsCode(err, CodeTopicNotExist) {
		return nil, fmt.Errorf("route of %s from %s: %w", topic, namesrv, ErrTopicNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("route of %s from %s: %w", topic, namesrv, err)
	}
	var route struct {
		BrokerDatas []struct {
			BrokerName  string            `json:"brokerName"`
			BrokerAddrs map[string]string `json:"brokerAddrs"`
		} `json:"brokerDatas"`
		QueueDatas []struct {
			BrokerName     string `json:"brokerName"`
			ReadQueueNums  int    `json:"readQueueNums"`
			WriteQueueNums int    `json:"writeQueueNums"`
			Perm           int    `json:"perm"`
		} `json:"queueDatas"`
	}
	if err := json.Unmarshal(fastJSON(resp.Body), &route); err != nil {
		return nil, fmt.Errorf("route of %s from %s: %w", topic, namesrv, err)
	}
	addrs := map[string]string{}
	for _, b := range route.BrokerDatas {
		addrs[b.BrokerName] = b.BrokerAddrs["0"]
	}
	var out []RouteBroker
	for _, q := range route.QueueDatas {
		out = append(out, RouteBroker{Name: q.BrokerName, Addr: addrs[q.BrokerName],
			ReadQueues: q.ReadQueueNums, WriteQueues: q.WriteQueueNums, Perm: q.Perm})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// fastJSON turns the JSON of RocketMQ's fastjson, whose map keys may be
// bare numbers ({0:"host:port"}), into JSON: it quotes the bare keys of
// objects. Strings are copied as they are.
func fastJSON(b []byte) []byte {
	var out strings.Builder
	out.Grow(len(b) + 16)
	var stack []byte // '{' or '['
	expectKey := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '"':
			j := i + 1
			for j < len(b) && b[j] != '"' {
				if b[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(b) {
				j = len(b) - 1
			}
			out.Write(b[i : j+1])
			i = j
			expectKey = false
			continue
		case c == '{' || c == '[':
			stack = append(stack, c)
			expectKey = c == '{'
		case c == '}' || c == ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			expectKey = false
		case c == ',':
			expectKey = len(stack) > 0 && stack[len(stack)-1] == '{'
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		case expectKey && c != '}':
			j := i
			for j < len(b) && b[j] != ':' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
				j++
			}
			out.WriteByte('"')
			out.Write(b[i:j])
			out.WriteByte('"')
			i = j - 1
			expectKey = false
			continue
		default:
			expectKey = false
		}
		out.WriteByte(c)
	}
	return []byte(out.String())
}
