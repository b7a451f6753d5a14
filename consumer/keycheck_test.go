package consumer_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
)

// TestKeyPathTypoIsAConfigurationError: a key path with a typo fails on
// every message. Each is dead-lettered, as before, but the consumer also
// says once, at ERROR, that the key function looks misconfigured, and
// Health carries it; a key function that fails on a few messages only is
// bad input, not a configuration error.
func TestKeyPathTypoIsAConfigurationError(t *testing.T) {
	for _, tc := range []struct {
		name    string
		key     consumer.KeyFunc
		spoil   int // messages without a txn_id: 0, 10, 20
		bad     int // messages whose key fails
		verdict bool
	}{
		{"typo", consumer.ByJSONField("txnid"), 0, 30, true},
		{"a few bad messages", consumer.ByJSONField("txn_id"), 3, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var logs bytes.Buffer
			logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return logs.Write(p)
			}), &slog.HandlerOptions{Level: slog.LevelError}))
			e := newEffects()
			cfg := baseConfig(e.apply)
			cfg.Key, cfg.Logger = tc.key, logger
			src := consumertest.NewSource(consumertest.Script{})
			dl := &consumertest.DeadLetters{}
			cfg.Source, cfg.DeadLetter = src, dl
			c, err := consumer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			msgs := payments(30)
			for i := range tc.spoil {
				msgs[i*10].Value = []byte(`{"amount":1}`) // no txn_id
			}
			src.Push(msgs...)
			runUntil(t, c, func() bool { s := c.Stats(); return s.Applied+s.DeadLettered == 30 })

			if s := c.Stats(); s.DeadLettered != int64(tc.bad) || s.Applied != int64(30-tc.bad) {
				t.Fatalf("dead-lettered %d, applied %d; want %d, %d", s.DeadLettered, s.Applied, tc.bad, 30-tc.bad)
			}
			if n := len(dl.Letters()); n != tc.bad {
				t.Fatalf("%d letters, want %d", n, tc.bad)
			}
			h := c.Health(t.Context())
			mu.Lock()
			errorLines := strings.Count(logs.String(), "level=ERROR")
			mu.Unlock()
			if !tc.verdict {
				if h.Misconfigured != nil || errorLines != 0 {
					t.Fatalf("%d bad messages of 30: Health.Misconfigured %v, %d ERROR lines; want none", tc.bad, h.Misconfigured, errorLines)
				}
				return
			}
			if !errors.Is(h.Misconfigured, consumer.ErrKeyMisconfigured) || !strings.Contains(h.Misconfigured.Error(), "Config.Key failed on 11 of the first 11 messages") {
				t.Fatalf("Health.Misconfigured = %v, want ErrKeyMisconfigured naming Config.Key", h.Misconfigured)
			}
			if errorLines != 1 {
				t.Fatalf("%d ERROR lines, want one:\n%s", errorLines, logs.String())
			}
		})
	}
}
