package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestStalePostgres: idem stale lists the stale events a real Postgres
// store recorded, the newest first, with the entity and both versions,
// every field inert; --scope and --entity select, and with both the
// entity's watermark is shown.
func TestStalePostgres(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	store := pgtest.Store(t, pool, schema)
	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema}
	ev := func(scope, id, entity string, major int64) dedup.EntityEvent {
		return dedup.EntityEvent{Key: dedup.Key{Scope: scope, ID: id}, Entity: entity, Version: dedup.Version{Major: major}}
	}
	// T1 closed at 3, then TRADE_SUCCESS (2) re-sent, then a copy of 3;
	// T2's 5 then 4; another scope's T1 on its own watermark.
	for _, batch := range [][]dedup.EntityEvent{
		{ev("alipay", "n1", "T1", 1), ev("alipay", "n3", "T1", 3), ev("alipay", "n2", "T1", 2)},
		{ev("alipay", "n3b", "T1", 3), ev("alipay", "m5", "T2\x1b[2K", 5), ev("alipay", "m4", "T2\x1b[2K", 4)},
		{ev("wechat", "w1", "T1", 1)},
	} {
		res := make([]dedup.Advance, len(batch))
		if err := store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return store.AdvanceEntities(ctx, tx, batch, res) }); err != nil {
			t.Fatal(err)
		}
	}

	code, out, _ := idem(t, "", envs, "stale", "--json")
	evs := decode[[]staleJSON](t, out)
	var got []string
	for _, e := range evs {
		got = append(got, e.Scope+"/"+e.Key+":"+e.Version+"<="+e.Watermark)
	}
	if want := "alipay/m4:4.0<=5.0 alipay/n3b:3.0<=3.0 alipay/n2:2.0<=3.0"; code != exitOK || strings.Join(got, " ") != want {
		t.Fatalf("idem stale --json: exit %d, %v; want %s (newest first)", code, got, want)
	}
	code, out, _ = idem(t, "", envs, "stale")
	if code != exitOK || !strings.Contains(out, "3 stale events") || !strings.Contains(out, "n3b") {
		t.Errorf("idem stale: exit %d\n%s", code, out)
	}
	assertInert(t, "idem stale", out)
	code, out, _ = idem(t, "", envs, "stale", "--scope", "alipay", "--entity", "T1")
	if code != exitOK || !strings.Contains(out, "watermark 3.0") || strings.Contains(out, "m4") || !strings.Contains(out, "2 stale events") {
		t.Errorf("idem stale --scope alipay --entity T1: exit %d\n%s", code, out)
	}
	code, out, _ = idem(t, "", envs, "stale", "--scope", "wechat", "--entity", "T1")
	if code != exitOK || !strings.Contains(out, "watermark 1.0") || !strings.Contains(out, "no stale events") {
		t.Errorf("idem stale --scope wechat --entity T1: exit %d\n%s", code, out)
	}
	if code, _, _ := idem(t, "", envs, "stale", "--limit", "0"); code != exitUsage {
		t.Errorf("--limit 0: exit %d, want usage", code)
	}
}

// TestStaleShowsProviderSteps: refund n2 of trade T1 called the provider
// (its step succeeded) in an attempt that rolled back, and ended stale
// behind n3; its in_doubt letter was lost to a crash after the commit
// (the redelivery is a duplicate). Refund n1b ended stale too, its
// provider having refused it (the step failed: nothing happened). idem
// stale shows n2's step, and only n2's: the record that is left must say
// that an effect may be unbooked.
func TestStaleShowsProviderSteps(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	store := pgtest.Store(t, pool, schema)
	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema}
	ev := func(id string, major int64) dedup.EntityEvent {
		return dedup.EntityEvent{Key: dedup.Key{Scope: "refunds", ID: id}, Entity: "T1", Version: dedup.Version{Major: major}}
	}
	batch := []dedup.EntityEvent{ev("n3", 3), ev("n2", 2), ev("n1b", 1)}
	res := make([]dedup.Advance, len(batch))
	if err := store.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return store.AdvanceEntities(ctx, tx, batch, res) }); err != nil {
		t.Fatal(err)
	}
	stepAt(t, store, pay("n3", "refund"), dedup.StepSucceeded, time.Minute, "")
	stepAt(t, store, pay("n2", "refund"), dedup.StepSucceeded, time.Minute, "")
	stepAt(t, store, pay("n1b", "refund"), dedup.StepFailed, time.Minute, "")

	code, out, _ := idem(t, "", envs, "stale", "--json")
	evs := decode[[]struct {
		Key   string
		Steps []struct{ Step, State, ProviderKey string }
	}](t, out)
	got := map[string]string{}
	for _, e := range evs {
		var s []string
		for _, st := range e.Steps {
			s = append(s, st.Step+" "+st.State)
		}
		got[e.Key] = strings.Join(s, ",")
	}
	if code != exitOK || len(evs) != 2 || got["n2"] != "refund succeeded" || got["n1b"] != "" {
		t.Errorf("idem stale --json: exit %d, steps by key %q; want n2's succeeded refund alone\n%s", code, got, out)
	}
	code, out, _ = idem(t, "", envs, "stale")
	if code != exitOK || !strings.Contains(out, "refund succeeded") || !strings.Contains(out, "1 of them called a provider") {
		t.Errorf("idem stale: exit %d: want n2's succeeded refund and the line that says it may be unbooked\n%s", code, out)
	}
}
