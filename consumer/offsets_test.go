package consumer_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/consumer/source"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/memstore"
)

// noOffsets is an OffsetStore for config checks; it is never called.
type noOffsets struct{}

func (noOffsets) NextOffset(context.Context, *memstore.Tx, dedup.Partition) (int64, error) {
	panic("not called")
}

func (noOffsets) AdvanceOffset(context.Context, *memstore.Tx, dedup.Partition, int64, int64) (bool, error) {
	panic("not called")
}

func (noOffsets) NextOffsets(context.Context, string, string) (map[int32]int64, error) {
	panic("not called")
}

func TestOffsetsConfig(t *testing.T) {
	base := consumer.Config[*memstore.Tx]{
		Name: "orders", Source: consumertest.NewSource(consumertest.Script{}), Store: memstore.New(memstore.Config{}),
		DeadLetter: &consumertest.DeadLetters{}, Offsets: noOffsets{},
		Handler: consumer.HandlerFunc[*memstore.Tx](func(context.Context, *memstore.Tx, *consumer.Message) error { return nil }),
	}
	if _, err := consumer.New(base); err != nil {
		t.Errorf("Offsets without Key: %v", err)
	}
	withKey := base
	withKey.Key = consumer.ByJSONField("id")
	if _, err := consumer.New(withKey); err != nil {
		t.Errorf("Offsets with a business Key: %v", err)
	}
	lanes := base
	lanes.KeyLanes = 4
	if _, err := consumer.New(lanes); err == nil || !strings.Contains(err.Error(), "Config.KeyLanes is 4 with Offsets") {
		t.Errorf("Offsets with KeyLanes: %v", err)
	}
	unordered := base
	unordered.Source = declaresNothing{consumertest.NewSource(consumertest.Script{})}
	if _, err := consumer.New(unordered); err == nil || !strings.Contains(err.Error(), "does not deliver each partition in offset order") {
		t.Errorf("Offsets with a source that does not say it delivers in offset order: %v", err)
	}
	reordered := base
	reordered.Source = consumertest.NewSource(consumertest.Script{ReorderWindow: 4})
	if _, err := consumer.New(reordered); err == nil || !strings.Contains(err.Error(), "does not deliver each partition in offset order") {
		t.Errorf("Offsets with a source that reorders: %v", err)
	}
	fallback := base
	fallback.OnMissingKey = consumer.FallBackToMessageID
	if _, err := consumer.New(fallback); err == nil || !strings.Contains(err.Error(), "Config.OnMissingKey") {
		t.Errorf("Offsets, no Key, FallBackToMessageID: %v", err)
	}
}

// declaresNothing is a Source whose Description is the zero one: not
// OffsetOrdered, whatever it wraps.
type declaresNothing struct{ source.Source }

func (declaresNothing) Describe() source.Description { return source.Description{} }

// oldStyle is a Source written for the optional interfaces that came
// before source.Description: it says it is offset-ordered by a method.
type oldStyle struct{ declaresNothing }

func (oldStyle) InOffsetOrder() bool { return true }

// TestOldCapabilityMethodsRefused: a Source that still says what it can
// do by a method the consumer no longer calls is refused by name, not
// silently taken to declare nothing.
func TestOldCapabilityMethodsRefused(t *testing.T) {
	cfg := baseConfig(newEffects().apply)
	cfg.Source = oldStyle{declaresNothing{consumertest.NewSource(consumertest.Script{})}}
	cfg.DeadLetter = &consumertest.DeadLetters{}
	_, err := consumer.New(cfg)
	if err == nil || !strings.Contains(err.Error(), "has the method InOffsetOrder (Description.OffsetOrdered)") {
		t.Fatalf("New: %v, want the method InOffsetOrder named", err)
	}
}
