package httpidem_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/testenv/sqlitetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func sqliteMiddleware(t *testing.T) *httpidem.Middleware[*sql.Tx] {
	t.Helper()
	st, _ := sqlitetest.Store(t, sqlitestore.Config{})
	m, err := httpidem.New(httpidem.Config[*sql.Tx]{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestNewWantsStore(t *testing.T) {
	if _, err := httpidem.New(httpidem.Config[*sql.Tx]{}); err == nil || !strings.Contains(err.Error(), "Config.Store") {
		t.Fatalf("New without a store: %v, want an error naming Config.Store", err)
	}
}

func TestBadRoutesPanic(t *testing.T) {
	m := sqliteMiddleware(t)
	h := httpidem.TxHandlerFunc[*sql.Tx](nil)
	for name, tc := range map[string]struct {
		route  httpidem.Route
		leased bool
		field  string
	}{
		"hash in name":          {httpidem.Route{Name: "/a#b"}, false, "Route.Name"},
		"control in name":       {httpidem.Route{Name: "/a\nb"}, false, "Route.Name"},
		"long name":             {httpidem.Route{Name: "/" + strings.Repeat("a", 64)}, false, "Route.Name"},
		"negative lease":        {httpidem.Route{Lease: -time.Second}, true, "Route.Lease"},
		"negative body limit":   {httpidem.Route{MaxRequestBytes: -1}, false, "Route.MaxRequestBytes"},
		"retention below lease": {httpidem.Route{Retention: time.Second, Lease: time.Minute}, true, "Route.Retention"},
	} {
		func() {
			defer func() {
				v := recover()
				err, _ := v.(error)
				if err == nil || !strings.Contains(err.Error(), tc.field) {
					t.Errorf("%s: panic %v, want an error naming %s", name, v, tc.field)
				}
			}()
			if tc.leased {
				m.Leased(tc.route)
			} else {
				m.Transactional(tc.route, h)
			}
		}()
	}
}
