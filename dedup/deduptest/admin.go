package deduptest

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
)

// AdminFactory returns a fresh, empty store and its dedup.Admin; scope
// "hour" keeps its rows for an hour, the others for ever.
type AdminFactory[TTx any] func(t *testing.T) (dedup.Store[TTx], dedup.Admin)

// RunAdmin checks a store's dedup.Admin: summary, find, failed, release (a
// done row is never released) and its dry run.
func RunAdmin[TTx any](t *testing.T, newStore AdminFactory[TTx]) {
	st, admin := newStore(t)
	ctx := ctxFor(t)
	if _, err := claimTx(ctx, st, Claim("pay", "a", "1"), Claim("pay", "b", "1"), Claim("hour", "c", "1"), Claim("other", "b", "1")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []dedup.Claim{Claim("pay", "f1", "1"), Claim("pay", "f2", "2")} {
		if err := st.RecordFailure(ctx, c, "account closed: "+c.Key.ID); err != nil {
			t.Fatal(err)
		}
	}

	sum, err := admin.Summary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type group struct{ scope, outcome string }
	got := map[group]dedup.ScopeSummary{}
	for _, s := range sum {
		got[group{s.Scope, s.Outcome}] = s
	}
	want := map[group]int64{{"pay", "done"}: 2, {"pay", "failed"}: 2, {"hour", "done"}: 1, {"other", "done"}: 1}
	if len(got) != len(want) {
		t.Errorf("summary: %+v", sum)
	}
	for g, n := range want {
		if s := got[g]; s.Rows != n || s.OldestKey == "" || s.OldestAt.IsZero() {
			t.Errorf("summary of %v: %+v, want %d rows", g, s, n)
		}
	}
	if s := got[group{"hour", "done"}]; s.Forever || s.Retention < 59*time.Minute || s.Retention > 61*time.Minute {
		t.Errorf("scope hour's retention: %+v", s)
	}
	if s := got[group{"pay", "done"}]; !s.Forever {
		t.Errorf("scope pay keeps its rows for ever: %+v", s)
	}

	rows, err := admin.Find(ctx, "", "b")
	if err != nil || len(rows) != 2 || rows[0].Key.Scope != "other" || rows[1].Key.Scope != "pay" {
		t.Errorf("Find(b) in every scope: %+v, %v", rows, err)
	}
	rows, err = admin.Find(ctx, "pay", "f1")
	if err != nil || len(rows) != 1 || rows[0].Outcome != "failed" || rows[0].Reason != "account closed: f1" ||
		rows[0].Fingerprint != dedup.FingerprintOf([]byte("1")) || rows[0].Source != "deduptest" || rows[0].CreatedAt.IsZero() {
		t.Errorf("Find(pay, f1): %+v, %v", rows, err)
	}
	if rows, err := admin.Find(ctx, "pay", "nope"); err != nil || len(rows) != 0 {
		t.Errorf("Find of a missing key: %+v, %v", rows, err)
	}

	failed, err := admin.Failed(ctx, dedup.RowFilter{Scope: "pay"})
	if err != nil || len(failed) != 2 {
		t.Errorf("Failed(pay): %+v, %v", failed, err)
	}
	if failed, err := admin.Failed(ctx, dedup.RowFilter{Reason: "f2"}); err != nil || len(failed) != 1 || failed[0].Key.ID != "f2" {
		t.Errorf("Failed(reason f2): %+v, %v", failed, err)
	}
	if failed, err := admin.Failed(ctx, dedup.RowFilter{OlderThan: time.Hour}); err != nil || len(failed) != 0 {
		t.Errorf("Failed(older than an hour): %+v, %v", failed, err)
	}
	if failed, err := admin.Failed(ctx, dedup.RowFilter{NewerThan: time.Hour, Limit: 1}); err != nil || len(failed) != 1 {
		t.Errorf("Failed(newer than an hour, limit 1): %+v, %v", failed, err)
	}

	keys := []dedup.Key{{Scope: "pay", ID: "f1"}, {Scope: "pay", ID: "a"}, {Scope: "pay", ID: "missing"}}
	dry, err := admin.Release(ctx, keys, true)
	if err != nil || len(dry) != 1 || dry[0].Key.ID != "f1" {
		t.Errorf("Release dry run: %+v, %v", dry, err)
	}
	if rows, _ := admin.Find(ctx, "pay", "f1"); len(rows) != 1 {
		t.Error("the dry run deleted the row")
	}
	done, err := admin.Release(ctx, keys, false)
	if err != nil || len(done) != 1 || done[0].Key.ID != "f1" {
		t.Errorf("Release: %+v, %v", done, err)
	}
	if rows, _ := admin.Find(ctx, "pay", "f1"); len(rows) != 0 {
		t.Error("the failed row is still there")
	}
	if rows, _ := admin.Find(ctx, "pay", "a"); len(rows) != 1 {
		t.Error("a done row was released")
	}
	// Released, the key can be claimed again.
	res, err := claimTx(ctx, st, Claim("pay", "f1", "1"))
	if err != nil || res[0].Status != dedup.StatusNew {
		t.Errorf("claim after release: %+v, %v", res, err)
	}
	if n, err := admin.Purge(ctx, 100); err != nil || n != 0 {
		t.Errorf("Purge with nothing expired: %d, %v", n, err)
	}
	runAudit(t, admin)
	runLock(t, admin)
}

// runLock checks Admin.Lock: a lock held is not taken again until it is
// let go, and then a waiter gets it; another name is another lock.
func runLock(t *testing.T, admin dedup.Admin) {
	ctx := ctxFor(t)
	unlock, err := admin.Lock(ctx, "redrive pay.dlq idem-redrive")
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if u, err := admin.Lock(short, "redrive pay.dlq idem-redrive"); err == nil {
		u()
		t.Errorf("Lock of a lock held: taken, want it to wait until its context ends")
	}
	cancel()
	other, err := admin.Lock(ctx, "redrive hour.dlq idem-redrive")
	if err != nil {
		t.Fatalf("Lock of another name while one is held: %v", err)
	}
	other()
	got := make(chan error, 1)
	go func() {
		u, err := admin.Lock(ctx, "redrive pay.dlq idem-redrive")
		if err == nil {
			u()
		}
		got <- err
	}()
	unlock()
	if err := <-got; err != nil {
		t.Errorf("Lock waiting for a lock let go: %v", err)
	}
}

// runAudit checks the audit log (dedup.Auditor): what is recorded comes
// back newest first, every field kept, stamped by the store.
func runAudit(t *testing.T, admin dedup.Admin) {
	ctx := ctxFor(t)
	if acts, err := admin.Actions(ctx, 0); err != nil || len(acts) != 0 {
		t.Fatalf("Actions of a new store: %+v, %v", acts, err)
	}
	start := time.Now().Add(-time.Minute)
	recorded := []dedup.Action{
		{Actor: "cli:alice", Kind: "release", Plan: []byte(`{"keys":[{"scope":"pay","key":"f1"}]}`), Outcome: "ok"},
		{Actor: "console:ops@127.0.0.1", Kind: "redrive", Plan: []byte(`{"letters":["pay.dlq/0/7"]}`), Outcome: "partial: 1 refused"},
	}
	for _, a := range recorded {
		if err := admin.RecordAction(ctx, a); err != nil {
			t.Fatalf("RecordAction(%+v): %v", a, err)
		}
	}
	acts, err := admin.Actions(ctx, 0)
	if err != nil || len(acts) != 2 {
		t.Fatalf("Actions: %+v, %v", acts, err)
	}
	for i, want := range []dedup.Action{recorded[1], recorded[0]} {
		got := acts[i]
		if got.Actor != want.Actor || got.Kind != want.Kind || got.Outcome != want.Outcome || got.At.Before(start) || got.At.After(time.Now().Add(time.Minute)) {
			t.Errorf("action %d: %+v, want %+v", i, got, want)
		}
		var g, w any
		if json.Unmarshal(got.Plan, &g) != nil || json.Unmarshal(want.Plan, &w) != nil || !reflect.DeepEqual(g, w) {
			t.Errorf("action %d's plan: %s, want %s", i, got.Plan, want.Plan)
		}
	}
	if acts[0].ID <= acts[1].ID {
		t.Errorf("IDs do not grow: %d after %d", acts[0].ID, acts[1].ID)
	}
	if acts, err := admin.Actions(ctx, 1); err != nil || len(acts) != 1 || acts[0].Kind != "redrive" {
		t.Errorf("Actions(1): %+v, %v", acts, err)
	}
	if err := admin.RecordAction(ctx, dedup.Action{Actor: "cli:bob", Kind: "purge", Plan: []byte(`not json`), Outcome: "ok"}); err == nil {
		t.Error("RecordAction took a plan that is not JSON")
	}
}
