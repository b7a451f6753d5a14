package retention

import (
	"strings"
	"testing"
	"time"
)

func TestOf(t *testing.T) {
	per := map[string]time.Duration{"short": time.Minute, "forever": 0}
	for _, c := range []struct {
		def    time.Duration
		scope  string
		want   time.Duration
		wantOK bool
	}{
		{def: time.Hour, scope: "other", want: time.Hour, wantOK: true},
		{def: time.Hour, scope: "short", want: time.Minute, wantOK: true},
		{def: time.Hour, scope: "forever", want: 0, wantOK: false},
		{def: 0, scope: "other", want: 0, wantOK: false},
		{def: 0, scope: "short", want: time.Minute, wantOK: true},
	} {
		got, ok := Of(c.def, per, c.scope)
		if got != c.want || ok != c.wantOK {
			t.Errorf("Of(%v, %q) = %v, %v; want %v, %v", c.def, c.scope, got, ok, c.want, c.wantOK)
		}
	}
}

func TestCheckScopes(t *testing.T) {
	if err := CheckScopes("teststore", map[string]time.Duration{"a": 0, "b": time.Hour}); err != nil {
		t.Fatal(err)
	}
	err := CheckScopes("teststore", map[string]time.Duration{"a": time.Hour, "b": -time.Second})
	if err == nil || !strings.Contains(err.Error(), `teststore: Config.ScopeRetention["b"] is negative`) {
		t.Fatalf("got %v, want the negative scope named", err)
	}
}
