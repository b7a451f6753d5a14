package httpidem_test

import (
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
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

// bodyKey is a Route.Key: the body is the key.
func bodyKey(_ *http.Request, body []byte) (string, error) { return string(body), nil }

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
		"key and header":        {httpidem.Route{Key: bodyKey, Header: "X-Key"}, false, "Route.Key"},
		"key and optional":      {httpidem.Route{Key: bodyKey, Optional: true}, false, "Route.Key"},
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

// TestRouteKeyFromBody: a route's Route.Key takes the key from the body;
// a body that names none, or an invalid one, is answered 400 naming it,
// and the handler does not run; one that names a key runs the handler
// once for it, and the same body again is replayed.
func TestRouteKeyFromBody(t *testing.T) {
	m := sqliteMiddleware(t)
	ran := 0
	h := m.Transactional(httpidem.Route{Name: "/callbacks", Key: bodyKey},
		httpidem.TxHandlerFunc[*sql.Tx](func(w http.ResponseWriter, _ *http.Request, _ *sql.Tx) error {
			ran++
			_, err := io.WriteString(w, "success")
			return err
		}))
	post := func(body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/callbacks", strings.NewReader(body)))
		return w
	}
	for _, body := range []string{"", "a\x00b", strings.Repeat("k", 257)} {
		if w := post(body); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "names no valid key") {
			t.Errorf("body %.20q: %d %s, want 400 naming no valid key", body, w.Code, w.Body)
		}
	}
	for range 2 {
		if w := post("n1"); w.Code != http.StatusOK || w.Body.String() != "success" {
			t.Errorf("body n1: %d %s, want 200 success", w.Code, w.Body)
		}
	}
	if ran != 1 {
		t.Errorf("handler ran %d times, want once (for n1, then replayed)", ran)
	}
}
