package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/sqlitestore"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// parkKeys parks, on p's clock ending now: cust-1 of orders/payments two
// hours ago (head n5, followers n6 and n7), its head settled an hour ago;
// a key of orders/refunds with an escape sequence in it half an hour ago,
// expired by a follower it had no room for; a binary record key of
// wechat/payments five minutes ago.
func parkKeys(t *testing.T, p dedup.Parking, now time.Time) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	ref := func(scope, topic, key, id string) dedup.ParkRef {
		return dedup.ParkRef{ParkKey: dedup.ParkKey{Scope: scope, Topic: topic, Key: key}, ID: id}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	out := make([]dedup.ParkDecision, 3)
	must(p.Park(ctx, ref("orders", "payments", "cust-1", "payments/0/4"), 10*time.Second, now.Add(-2*time.Hour)))
	must(p.CheckParked(ctx, []dedup.ParkRef{ref("orders", "payments", "cust-1", "payments/0/5"), ref("orders", "payments", "cust-1", "payments/0/6"),
		ref("orders", "payments", "cust-1", "payments/0/7")}, dedup.ParkLimits{}, now.Add(-2*time.Hour), out))
	must(p.Unpark(ctx, ref("orders", "payments", "cust-1", "payments/0/4"), now.Add(-time.Hour)))
	must(p.Park(ctx, ref("orders", "refunds", "cust\x1b[2K", "refunds/1/9"), time.Minute, now.Add(-30*time.Minute)))
	must(p.CheckParked(ctx, []dedup.ParkRef{ref("orders", "refunds", "cust\x1b[2K", "refunds/1/10")}, dedup.ParkLimits{Depth: 1}, now.Add(-30*time.Minute), out))
	must(p.Park(ctx, ref("wechat", "payments", "\xff\x00bin", "payments/2/1"), time.Second, now.Add(-5*time.Minute)))
}

// TestParkedPostgres: idem parked lists the keys a real Postgres store
// keeps parked, the longest parked first, with head, depth, both ages and
// expiry, every field inert, and how many there are in all; --scope,
// --topic, --key and --limit select; a store whose schema predates
// parking is refused with what to do.
func TestParkedPostgres(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	ctx := testenv.Context(t, 2*time.Minute)
	store := pgtest.Store(t, pool, schema)
	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema}
	if code, out, _ := idem(t, "", envs, "parked"); code != exitOK || !strings.Contains(out, "no parked keys") {
		t.Fatalf("idem parked of no parked key: exit %d\n%s", code, out)
	}
	parkKeys(t, store, time.Now())

	code, out, _ := idem(t, "", envs, "parked", "--json")
	keys := decode[[]parkedJSON](t, out)
	var got []string
	for _, k := range keys {
		got = append(got, k.Scope+"/"+k.Topic+"/"+k.Head+":"+strings.Repeat("+", k.Depth)+map[bool]string{true: " expired"}[k.Expired])
	}
	if want := "orders/payments/payments/0/5:+++ orders/refunds/refunds/1/9:+ expired wechat/payments/payments/2/1:+"; code != exitOK || strings.Join(got, " ") != want {
		t.Fatalf("idem parked --json: exit %d, %v; want %s (the longest parked first)", code, got, want)
	}
	if k := keys[0]; k.Key != "cust-1" || k.HeadDelay != "10s" || time.Since(k.ParkedAt) < 2*time.Hour || time.Since(k.HeadSince) > 2*time.Hour {
		t.Errorf("idem parked --json: cust-1 is %+v: want head delay 10s, parked 2h ago, its head since 1h ago", k)
	}
	if k := keys[2]; k.KeyBase64 != "/wBiaW4=" {
		t.Errorf("idem parked --json: the binary record key's key_base64 is %q, want its bytes, /wBiaW4=", k.KeyBase64)
	}

	code, out, _ = idem(t, "", envs, "parked")
	lines := strings.Split(out, "\n")
	if code != exitOK || len(lines) < 4 || strings.Join(strings.Fields(lines[0]), " ") != "SCOPE TOPIC KEY HEAD DEPTH PARKED_AGE HEAD_AGE EXPIRED" ||
		strings.Join(strings.Fields(lines[1]), " ") != "orders payments cust-1 payments/0/5 3 2h0m 1h0m no" ||
		!strings.HasSuffix(strings.Join(strings.Fields(lines[2]), " "), "1 30m0s 30m0s yes") ||
		!strings.Contains(out, "3 parked keys in all (3 shown), the oldest parked 2h0m ago") {
		t.Errorf("idem parked: exit %d\n%s", code, out)
	}
	assertInert(t, "idem parked", out)

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--scope", "wechat"}, "payments/2/1"},
		{[]string{"--topic", "refunds"}, "refunds/1/9"},
		{[]string{"--key", "cust-1"}, "payments/0/5"},
		{[]string{"--scope", "orders", "--topic", "payments"}, "payments/0/5"},
		{[]string{"--limit", "1"}, "payments/0/5"},
		{[]string{"--scope", "nobody"}, ""},
	} {
		code, out, _ := idem(t, "", envs, append([]string{"parked", "--json"}, c.args...)...)
		var heads []string
		for _, k := range decode[[]parkedJSON](t, out) {
			heads = append(heads, k.Head)
		}
		if code != exitOK || strings.Join(heads, " ") != c.want {
			t.Errorf("idem parked --json %v: exit %d, heads %v; want %q", c.args, code, heads, c.want)
		}
	}
	if _, out, _ := idem(t, "", envs, "parked", "--limit", "1"); !strings.Contains(out, "3 parked keys in all (1 shown)") {
		t.Errorf("idem parked --limit 1: want the count of all and of those shown\n%s", out)
	}
	if code, _, _ := idem(t, "", envs, "parked", "--limit", "0"); code != exitUsage {
		t.Errorf("--limit 0: exit %d, want usage", code)
	}

	// A schema from before parking: the table is not there.
	if _, err := pool.Exec(ctx, "DROP TABLE "+schema+".idem_dedup_parked_keys"); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idem(t, "", envs, "parked")
	if code != exitError || !strings.Contains(errOut, "run idem migrate") {
		t.Errorf("idem parked on a schema without parked keys: exit %d, stderr %q, want an error that says to run idem migrate\n%s", code, errOut, out)
	}
}

// TestParkedSQLite: idem parked on an SQLite store, and its refusal of a
// file migrated before parking.
func TestParkedSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	envs := map[string]string{"IDEM_SQLITE": path}
	if code, _, _ := idem(t, "", envs, "migrate"); code != exitOK {
		t.Fatalf("migrate: exit %d", code)
	}
	db, err := sqlitestore.Open(path, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := sqlitestore.New(db, sqlitestore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	parkKeys(t, st, time.Now())

	code, out, _ := idem(t, "", envs, "parked", "--json", "--scope", "orders")
	keys := decode[[]parkedJSON](t, out)
	if code != exitOK || len(keys) != 2 || keys[0].Key != "cust-1" || keys[0].Depth != 3 || keys[0].Head != "payments/0/5" || !keys[1].Expired {
		t.Fatalf("idem parked --json --scope orders: exit %d, %+v; want cust-1 (head payments/0/5, depth 3), then the expired key", code, keys)
	}
	code, out, _ = idem(t, "", envs, "parked")
	if code != exitOK || !strings.Contains(out, "cust-1") || !strings.Contains(out, "3 parked keys in all (3 shown)") {
		t.Errorf("idem parked: exit %d\n%s", code, out)
	}
	assertInert(t, "idem parked", out)

	if _, err := db.ExecContext(context.Background(), `DROP TABLE idem_dedup_parked_keys`); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := idem(t, "", envs, "parked")
	if code != exitError || !strings.Contains(errOut, "run idem migrate") {
		t.Errorf("idem parked on a file without parked keys: exit %d, stderr %q, want an error that says to run idem migrate", code, errOut)
	}
}
