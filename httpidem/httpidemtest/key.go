package httpidemtest

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/httpidem"
)

// keyFromCases are header values and the key httpidem.KeyFrom must give a
// handler: the value as it stands, or the inside of its quoted form.
var keyFromCases = []struct{ header, key string }{
	{"k-bare", "k-bare"},
	{`"k-quoted"`, "k-quoted"},
	{`"k \"esc\\aped\""`, `k "esc\aped"`},
}

// keyFromHandler answers 201 with the key KeyFrom gives, or 500 when it
// gives none.
func keyFromHandler(w http.ResponseWriter, r *http.Request) {
	key, ok := httpidem.KeyFrom(r.Context())
	if !ok {
		http.Error(w, "KeyFrom: no key", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(key))
}

// checkKeyFrom sends each case twice (the second a replay) and a keyless
// request to an Optional route: the handler sees the decoded key, and no
// key without one.
func checkKeyFrom(t *testing.T, srv, optional http.Handler) {
	t.Helper()
	for _, c := range keyFromCases {
		for range 2 {
			w := serve(srv, post(c.header, body100))
			if w.Code != http.StatusCreated || w.Body.String() != c.key {
				t.Fatalf("Idempotency-Key: %s: %d %q; want 201 and KeyFrom %q", c.header, w.Code, w.Body, c.key)
			}
		}
	}
	// The quoted form and the bare value are one key.
	if w := serve(srv, post(`"k-bare"`, body100)); !replayed(w) || w.Body.String() != "k-bare" {
		t.Fatalf(`Idempotency-Key: "k-bare" after k-bare: %d replayed %v %q; want the replay`, w.Code, replayed(w), w.Body)
	}
	if w := serve(optional, post("", body100)); w.Code != http.StatusInternalServerError {
		t.Fatalf("no key on an Optional route: %d %q; want KeyFrom to report none", w.Code, w.Body)
	}
}

func (s suite[TTx]) txKeyFrom(t *testing.T) {
	h := s.harness(t, Config{})
	m := newMiddleware(t, h.Store, nil)
	handler := httpidem.TxHandlerFunc[TTx](func(w http.ResponseWriter, r *http.Request, _ TTx) error {
		keyFromHandler(w, r)
		return nil
	})
	checkKeyFrom(t, m.Transactional(httpidem.Route{Name: "/payments"}, handler),
		m.Transactional(httpidem.Route{Name: "/payments", Optional: true}, handler))
}

func (s suite[TTx]) leaseKeyFrom(t *testing.T) {
	h := s.harness(t, Config{})
	m := newMiddleware(t, h.Store, nil)
	checkKeyFrom(t, m.Leased(httpidem.Route{Name: "/payments"})(http.HandlerFunc(keyFromHandler)),
		m.Leased(httpidem.Route{Name: "/payments", Optional: true})(http.HandlerFunc(keyFromHandler)))
}
