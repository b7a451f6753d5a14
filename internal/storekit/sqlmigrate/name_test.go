package sqlmigrate_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"idem_dedup", "_t", "t" + strings.Repeat("x", 47)} {
		if err := sqlmigrate.CheckName("teststore", "Table", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Idem", "9t", "idem-dedup", `a"b`, "t" + strings.Repeat("x", 48)} {
		err := sqlmigrate.CheckName("teststore", "Table", bad)
		if err == nil || !strings.HasPrefix(err.Error(), "teststore: Config.Table ") {
			t.Errorf("%q: got %v, want an error naming teststore's Config.Table", bad, err)
		}
	}
}
