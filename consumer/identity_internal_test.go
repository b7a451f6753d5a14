package consumer

import (
	"testing"

	"github.com/idemkit/idem/consumer/internal/envelope"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
)

// offsetsOnly is an OffsetStore that is never called: deriveKey only asks
// whether one is set.
type offsetsOnly struct{ dedup.OffsetStore[struct{}] }

// TestOffsetsFingerprintARedrivenCopyAsItsOriginal: with Config.Offsets
// and no Key, a redriven copy is claimed under its original's identity;
// its fingerprint must be its original's too, taken over the original's
// view (originalView), as every other key derivation does. A Fingerprint
// that reads the message's position (or its headers) otherwise gives two
// copies of one original two fingerprints: a mismatch, not a duplicate.
func TestOffsetsFingerprintARedrivenCopyAsItsOriginal(t *testing.T) {
	c := &Consumer[struct{}]{cfg: Config[struct{}]{Name: "payments", Offsets: offsetsOnly{},
		Fingerprint: func(m *Message) (dedup.Fingerprint, error) { return dedup.FingerprintOf([]byte(m.Coordinates())), nil }}}
	red := &Message{Topic: "pay", Partition: 0, Offset: 12, ID: "pay/0/12", Headers: []Header{
		{Key: wire.MetaTopic, Value: []byte("pay")}, {Key: wire.MetaPartition, Value: []byte("0")}, {Key: wire.MetaOffset, Value: []byte("5")},
		{Key: wire.MetaMessageID, Value: []byte("pay/0/5")}, {Key: wire.MetaRedriveCount, Value: []byte("1")}}}
	o, why := lineageOf(red, false, nil)
	if why != "" {
		t.Fatal(why)
	}
	envelope.SetOrigin(red, o)
	it := &item{msg: red}
	if err := c.deriveKey(it, false); err != nil {
		t.Fatal(err)
	}
	want := dedup.FingerprintOf([]byte("pay/0/5"))
	if it.claim.Key.ID != "pay/0/5" || it.claim.Fingerprint != want {
		t.Errorf("the redriven copy pay/0/12 of pay/0/5 is claimed as %q with fingerprint %x, want %q with %x: fingerprinted as delivered, not as its original",
			it.claim.Key.ID, it.claim.Fingerprint[:4], "pay/0/5", want[:4])
	}
}
