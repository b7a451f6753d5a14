package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestConsoleParkedKeys: the console's Parked keys page lists what the
// store keeps parked (real Postgres) — scope, topic, record key, head,
// depth, ages, expired — the total, and filters by key. A record key that
// carries markup, a bidi override and a terminal escape is shown inert.
func TestConsoleParkedKeys(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	store := pgtest.Store(t, pool, schema)
	hostile := "<script>alert(1)</script>\u202ek\x1b[8m"
	ref := func(key, id string) dedup.ParkRef {
		return dedup.ParkRef{ParkKey: dedup.ParkKey{Scope: "payments", Topic: "orders", Key: key}, ID: id}
	}
	now := time.Now()
	for _, r := range []dedup.ParkRef{ref("acct-1", "orders/0/7"), ref("acct-1", "orders/0/9"), ref(hostile, "orders/1/3")} {
		if err := store.Park(ctx, r, 10*time.Second, now.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
	}

	c := &console{admin: store.Admin(), reqs: store, journal: store, checkHost: true}
	auth, err := newConsoleAuth(testConsoleToken, "tester", "7464", false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c.auth = auth
	h := c.handler()
	get := func(target string) string {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Host = "127.0.0.1:7464"
		r.Header.Set("Authorization", "Bearer "+testConsoleToken)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		body, _ := io.ReadAll(w.Body)
		if w.Code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", target, w.Code, body)
		}
		return string(body)
	}

	body := get("/parked")
	i := strings.Index(body, `<table id="parked">`)
	if i < 0 {
		t.Fatalf("no table of parked keys:\n%s", body)
	}
	table := body[i:]
	table = table[:strings.Index(table, "</table>")]
	if rows := strings.Count(table, "<tr><td>"); rows != 2 {
		t.Fatalf("%d rows, want the 2 parked keys:\n%s", rows, table)
	}
	for _, want := range []string{"<td>payments</td><td>orders</td><td>acct-1</td><td>orders/0/7</td><td class=\"n\">2</td>", "&lt;script&gt;", "<td>no</td>"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	if !strings.Contains(body, `id="parked-total">2 parked key(s) in all`) {
		t.Errorf("no total of 2 keys:\n%s", body)
	}
	for _, bad := range []string{"<script>", "\u202e", "\x1b"} {
		if strings.Contains(body, bad) {
			t.Errorf("the page carries %q raw", bad)
		}
	}

	one := get("/parked?key=" + url.QueryEscape("acct-1"))
	if n := strings.Count(one, "<tr><td>"); n != 1 || !strings.Contains(one, "orders/0/7") {
		t.Errorf("filtered to acct-1: %d rows, want its one:\n%s", n, one)
	}

	// Both settled: the key is released, and the page says so.
	for _, r := range []dedup.ParkRef{ref("acct-1", "orders/0/7"), ref("acct-1", "orders/0/9"), ref(hostile, "orders/1/3")} {
		if err := store.Unpark(ctx, r, now); err != nil {
			t.Fatal(err)
		}
	}
	if none := get("/parked"); !strings.Contains(none, `id="parked-total">No parked keys`) || strings.Contains(none, `<table id="parked">`) {
		t.Errorf("after every key was released:\n%s", none)
	}
}
