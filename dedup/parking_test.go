package dedup_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/dedup"
)

// TestParkRefValidate: a ref is valid within its bounds, and each error
// names the bound that was passed, the scope's being MaxScopeLen.
func TestParkRefValidate(t *testing.T) {
	ok := dedup.ParkRef{ParkKey: dedup.ParkKey{Scope: strings.Repeat("s", dedup.MaxScopeLen), Topic: "t", Key: "k"}, ID: "p/0/1"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a ref within bounds: %v", err)
	}
	for _, c := range []struct {
		mut  func(*dedup.ParkRef)
		want string
	}{
		{func(r *dedup.ParkRef) { r.Scope += "s" }, "at most " + strconv.Itoa(dedup.MaxScopeLen) + " bytes"},
		{func(r *dedup.ParkRef) { r.Topic = "" }, "topic must be 1 to 1000 bytes"},
		{func(r *dedup.ParkRef) { r.Key = strings.Repeat("k", 1001) }, "record key must be 1 to 1000 bytes"},
		{func(r *dedup.ParkRef) { r.ID = "" }, "ID must be 1 to 400 bytes"},
	} {
		r := ok
		c.mut(&r)
		if err := r.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate: %v, want an error saying %q", err, c.want)
		}
	}
}
