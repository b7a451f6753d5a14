package hostport

import (
	"fmt"
	"slices"
	"testing"
)

func TestCheckList(t *testing.T) {
	for _, c := range []struct {
		list []string
		want []string
	}{
		{nil, []string{"Brokers is empty"}},
		{[]string{"h:1", "[::1]:9092"}, nil},
		{[]string{"h:1", "h"}, []string{`Brokers[1] "h": want host:port: address h: missing port in address`}},
	} {
		var got []string
		CheckList("Brokers", c.list, func(format string, args ...any) { got = append(got, fmt.Sprintf(format, args...)) })
		if !slices.Equal(got, c.want) {
			t.Errorf("CheckList(%q) = %q, want %q", c.list, got, c.want)
		}
	}
}
