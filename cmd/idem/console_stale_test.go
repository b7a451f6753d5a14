package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestConsoleStaleEvents: the console's Stale events page lists what the
// store recorded (real Postgres) — entity, both versions, key, age — the
// provider step of the stale refund whose effect may be unbooked, and,
// filtered to one entity, its watermark. An entity and a key that carry
// markup, a bidi override and a terminal escape are shown inert.
func TestConsoleStaleEvents(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	store := pgtest.Store(t, pool, schema)
	hostileEntity := "<script>alert(1)</script>\u202eT9\x1b[8m"
	hostileKey := "n<i>\u202e9"
	ev := func(id, entity string, major int64) dedup.EntityEvent {
		return dedup.EntityEvent{Key: dedup.Key{Scope: "refunds", ID: id}, Entity: entity, Version: dedup.Version{Major: major, Minor: 2}}
	}
	batch := []dedup.EntityEvent{ev("n3", "T1", 3), ev("n2", "T1", 2), ev("m2", hostileEntity, 5), ev(hostileKey, hostileEntity, 4)}
	res := make([]dedup.Advance, len(batch))
	if err := store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return store.AdvanceEntities(ctx, tx, batch, res) }); err != nil {
		t.Fatal(err)
	}
	stepAt(t, store, pay("n2", "refund"), dedup.StepSucceeded, time.Minute, "")

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

	body := get("/stale")
	table := body[strings.Index(body, `<table id="stale">`):]
	table = table[:strings.Index(table, "</table>")]
	if rows := strings.Count(table, "<tr><td>"); rows != 2 {
		t.Fatalf("%d rows, want the 2 stale events:\n%s", rows, table)
	}
	for _, want := range []string{"<td>refunds</td><td>n2</td><td>T1</td>", "<code>2.2</code>", "<code>3.2</code>", "refund succeeded", "<code>4.2</code>", "<code>5.2</code>", " ago</td>"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	if !strings.Contains(body, `id="stale-steps">1 of them called a provider`) {
		t.Errorf("no warning about the stale event with a provider step:\n%s", body)
	}
	for _, bad := range []string{"<script>", "<i>", "\u202e", "\x1b"} {
		if strings.Contains(body, bad) {
			t.Errorf("the page carries %q raw", bad)
		}
	}
	if !strings.Contains(table, "&lt;script&gt;") {
		t.Errorf("the hostile entity is not shown escaped:\n%s", table)
	}

	one := get("/stale?scope=refunds&entity=T1")
	if !strings.Contains(one, `watermark <code>3.2</code>`) || strings.Count(one, "<tr><td>") != 1 {
		t.Errorf("filtered to T1: want its watermark 3.2 and one row:\n%s", one)
	}
	none := get("/stale?scope=refunds&entity=" + url.QueryEscape("T404"))
	if !strings.Contains(none, "no watermark") || !strings.Contains(none, `id="empty"`) {
		t.Errorf("an entity without events:\n%s", none)
	}
}
