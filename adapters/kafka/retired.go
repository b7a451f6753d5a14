package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// ErrRetiredRetryTopic is what Run returns when a retry topic of one of
// Config.Topics still holds copies the group began to read and has not
// finished, but its delay is no longer in Config.RetryDelays (taken out,
// or every delay with a move back to Blocking retries): the Source would
// no longer read it, and those copies' originals were acknowledged when
// the copies were written. Put the delay back until the copies are read
// (`idem retries` shows them), then take it out.
var ErrRetiredRetryTopic = errors.New("kafka: a retry topic whose delay is not in Config.RetryDelays holds unread copies")

// checkRetiredRetryTopics looks, before Run joins the group, for retry
// topics of Config.Topics (RetryTopic names: <topic>.retry.<delay>) whose
// delay is not in Config.RetryDelays, and returns ErrRetiredRetryTopic,
// naming each with its unread copies, when the group has a committed
// offset on one of its partitions below that partition's end: the group
// read copies there before, and some wait.
//
// Retry topics are named for the topic, not the group, and a copy does
// not say which group wrote it: a partition the group has no offset on is
// left out, so that another group of the topic (an audit service, a new
// group with Blocking retries) is not refused for the copies of the group
// that writes them. The limit: copies this group wrote to a partition it
// never committed an offset on (its retry reader had not yet read one
// copy there when the delay was retired) cannot be told from another
// group's, and are not counted.
//
// A check that cannot reach the cluster is logged and skipped: the
// group's join retries reaching it anyway.
func (s *Source) checkRetiredRetryTopics(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*s.cfg.RequestTimeout)
	defer cancel()
	tr := &kafkago.Transport{DialTimeout: s.cfg.DialTimeout, ClientID: s.cfg.ClientID, TLS: s.cfg.TLS, SASL: s.cfg.SASL}
	defer tr.CloseIdleConnections()
	cl := &kafkago.Client{Addr: kafkago.TCP(s.cfg.Brokers...), Transport: tr, Timeout: s.cfg.RequestTimeout}
	unread, err := s.retiredCopies(ctx, cl)
	if err != nil {
		s.log.Warn("kafka: cannot check for retry topics of retired delays; going on", slog.Any("error", err))
		return nil
	}
	if len(unread) == 0 {
		return nil
	}
	var parts []string
	for _, topic := range slices.Sorted(maps.Keys(unread)) {
		parts = append(parts, fmt.Sprintf("%s holds %d", topic, unread[topic]))
	}
	return fmt.Errorf("%w: %s (Config.RetryDelays %v): put the delay back until the group has read them",
		ErrRetiredRetryTopic, strings.Join(parts, ", "), s.cfg.RetryDelays)
}

// retiredCopies returns, by retry topic of a retired delay, how many of
// its records the group has not read on the partitions it has a committed
// offset on; topics with none are left out.
func (s *Source) retiredCopies(ctx context.Context, cl *kafkago.Client) (map[string]int64, error) {
	md, err := cl.Metadata(ctx, &kafkago.MetadataRequest{})
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, t := range md.Topics {
		if t.Error != nil || !s.retired(t.Name) {
			continue
		}
		reqs := make([]kafkago.OffsetRequest, 0, 2*len(t.Partitions))
		ids := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			reqs = append(reqs, kafkago.FirstOffsetOf(p.ID), kafkago.LastOffsetOf(p.ID))
			ids = append(ids, p.ID)
		}
		offs, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{t.Name: reqs}})
		if err != nil {
			return nil, fmt.Errorf("offsets of %s: %w", t.Name, err)
		}
		committed, err := cl.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: s.cfg.Group, Topics: map[string][]int{t.Name: ids}})
		if err == nil {
			err = committed.Error
		}
		if err != nil {
			return nil, fmt.Errorf("the group's offsets of %s: %w", t.Name, err)
		}
		group := map[int]int64{}
		for _, p := range committed.Topics[t.Name] {
			if p.Error == nil && p.CommittedOffset >= 0 {
				group[p.Partition] = p.CommittedOffset
			}
		}
		for _, p := range offs.Topics[t.Name] {
			if p.Error != nil {
				return nil, fmt.Errorf("offsets of %s/%d: %w", t.Name, p.Partition, p.Error)
			}
			from, ok := group[p.Partition]
			if !ok {
				continue // never read by this group: another group's copies, or the limit above
			}
			from = max(from, p.FirstOffset)
			if n := p.LastOffset - from; n > 0 {
				out[t.Name] += n
			}
		}
	}
	return out, nil
}

// retired reports whether name is a retry topic of one of Config.Topics
// for a delay Config.RetryDelays does not have.
func (s *Source) retired(name string) bool {
	if _, ok := s.retryOf[name]; ok {
		return false
	}
	for _, t := range s.cfg.Topics {
		if _, isRetry := s.retryOf[t]; isRetry {
			continue
		}
		suffix, ok := strings.CutPrefix(name, t+".retry.")
		if !ok {
			continue
		}
		d, err := time.ParseDuration(suffix)
		if err == nil && d > 0 && RetryTopic(t, d) == name && !slices.Contains(s.cfg.RetryDelays, d) {
			return true
		}
	}
	return false
}
