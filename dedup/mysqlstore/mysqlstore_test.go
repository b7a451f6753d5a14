package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/mysqlstore"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	// The driver logs broken connections to stderr; the fault tests break
	// them on purpose.
	_ = mysql.SetLogger(discard{})
	goleak.VerifyTestMain(m)
}

type discard struct{}

func (discard) Print(...any) {}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testDB opens a pool on a fresh database, set up for cfg.
func testDB(t testing.TB, cfg mysqlstore.Config) (*sql.DB, string) {
	t.Helper()
	dsn := testenv.MySQLDatabase(t, testenv.MySQLDSN(t))
	db, err := mysqlstore.Open(dsn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("mysql: %v", err)
	}
	return db, dsn
}

func newStore(t testing.TB, cfg mysqlstore.Config) (*mysqlstore.Store, *sql.DB) {
	t.Helper()
	db, _ := testDB(t, cfg)
	st, err := mysqlstore.New(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st, db
}

func TestConformance(t *testing.T) {
	deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[*sql.Tx] {
		st, _ := newStore(t, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention})
		return st
	})
}

// TestConformanceRepeatableRead: the claim does not depend on the isolation
// level, nor on the pool being set up by Open (New on a plain *sql.DB sets
// each transaction up itself).
func TestConformanceRepeatableRead(t *testing.T) {
	deduptest.Run(t, func(t *testing.T, cfg deduptest.Config) dedup.Store[*sql.Tx] {
		dsn := testenv.MySQLDatabase(t, testenv.MySQLDSN(t))
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		st, err := mysqlstore.New(db, mysqlstore.Config{LockTimeout: cfg.LockTimeout, ScopeRetention: cfg.ScopeRetention, Isolation: sql.LevelRepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		return st
	})
}

// TestSessionSettings: every transaction runs at the configured isolation
// level and lock wait timeout, from Open's pool or a plain one. The level is
// told by what it does: a row committed by another transaction between two
// reads shows in the second under READ COMMITTED only.
func TestSessionSettings(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      mysqlstore.Config
		fromOpen bool
		fresh    bool // READ COMMITTED
		wait     int
	}{
		{"Open default", mysqlstore.Config{}, true, true, 5},
		{"Open repeatable read", mysqlstore.Config{Isolation: sql.LevelRepeatableRead, LockTimeout: 1500 * time.Millisecond}, true, false, 2},
		{"plain pool", mysqlstore.Config{LockTimeout: 200 * time.Millisecond}, false, true, 1},
		{"plain pool repeatable read", mysqlstore.Config{Isolation: sql.LevelRepeatableRead}, false, false, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, dsn := testDB(t, tc.cfg)
			if _, err := db.Exec(`CREATE TABLE iso (id INT PRIMARY KEY, v INT NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(`INSERT INTO iso VALUES (1, 1)`); err != nil {
				t.Fatal(err)
			}
			other := db
			if !tc.fromOpen {
				plain, err := sql.Open("mysql", dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer plain.Close()
				db = plain
			}
			st, err := mysqlstore.New(db, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			var before, after, wait int
			err = st.InTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
				if err := tx.QueryRowContext(ctx, `SELECT v FROM iso WHERE id = 1`).Scan(&before); err != nil {
					return err
				}
				if _, err := other.ExecContext(ctx, `UPDATE iso SET v = 2 WHERE id = 1`); err != nil {
					return err
				}
				return tx.QueryRowContext(ctx, `SELECT v, @@innodb_lock_wait_timeout FROM iso WHERE id = 1`).Scan(&after, &wait)
			})
			if err != nil {
				t.Fatal(err)
			}
			if fresh := after != before; fresh != tc.fresh || wait != tc.wait {
				t.Fatalf("read %d then %d (READ COMMITTED: %v), innodb_lock_wait_timeout %d; want READ COMMITTED %v and %d", before, after, fresh, wait, tc.fresh, tc.wait)
			}
		})
	}
}

// TestKeysCompareByteForByte: keys that a case-insensitive or padding
// collation would merge are distinct keys.
func TestKeysCompareByteForByte(t *testing.T) {
	st, _ := newStore(t, mysqlstore.Config{})
	ids := []string{"k", "K", "k ", " k", "é", "e\u0301", "ß", "ss", "😀", "a\u00a0"}
	ctx := context.Background()
	var cs []dedup.Claim
	for _, id := range ids {
		cs = append(cs, deduptest.Claim("s", id, "p"))
	}
	for round, want := range []dedup.Status{dedup.StatusNew, dedup.StatusDuplicate} {
		// One key per transaction: the rows already there decide.
		for i, c := range cs {
			res := make([]dedup.Result, 1)
			if err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				return st.Claim(ctx, tx, []dedup.Claim{c}, res)
			}); err != nil {
				t.Fatal(err)
			}
			if res[0].Status != want {
				t.Fatalf("round %d: key %q: %v, want %v", round, ids[i], res[0].Status, want)
			}
		}
	}
}

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	db, _ := testDB(t, mysqlstore.Config{})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			st, err := mysqlstore.New(db, mysqlstore.Config{Table: "dedup_x"})
			if err == nil {
				err = st.Migrate(ctx)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	var n, versions int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT version) FROM idem_schema_migrations WHERE table_name = 'dedup_x'`).Scan(&n, &versions); err != nil {
		t.Fatal(err)
	}
	if n != 9 || versions != 9 {
		t.Fatalf("%d migration rows for %d migrations, want 9 rows for the 9 migrations", n, versions)
	}
	var collation string
	if err := db.QueryRow(`SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'dedup_x' AND COLUMN_NAME = 'key'`).Scan(&collation); err != nil {
		t.Fatal(err)
	}
	if collation != "utf8mb4_nopad_bin" && collation != "utf8mb4_0900_bin" {
		t.Fatalf("key column collation %s, want a binary NO PAD one", collation)
	}
}

func TestCheck(t *testing.T) {
	db, _ := testDB(t, mysqlstore.Config{})
	st, err := mysqlstore.New(db, mysqlstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Check(ctx); !errors.Is(err, dedup.ErrNotMigrated) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Check before Migrate: %v, want ErrNotMigrated naming Migrate", err)
	}
	other, err := mysqlstore.New(db, mysqlstore.Config{Table: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Check(ctx); !errors.Is(err, dedup.ErrNotMigrated) {
		t.Fatalf("Check with only another table migrated: %v, want ErrNotMigrated", err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Check(ctx); err != nil {
		t.Fatalf("Check after Migrate: %v", err)
	}
	if _, err := db.Exec("DROP TABLE idem_dedup"); err != nil {
		t.Fatal(err)
	}
	if err := st.Check(ctx); !errors.Is(err, dedup.ErrNotMigrated) {
		t.Fatalf("Check after the table was dropped: %v, want ErrNotMigrated", err)
	}
}

func TestConfigErrors(t *testing.T) {
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/x")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, cfg := range []mysqlstore.Config{
		{Table: "dedup`; DROP TABLE x; --"},
		{Database: "Upper"},
		{Table: strings.Repeat("a", 49)},
		{LockTimeout: -time.Second},
		{Isolation: sql.LevelSerializable},
		{ScopeRetention: map[string]time.Duration{"x": -1}},
	} {
		if _, err := mysqlstore.New(db, cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		} else if !strings.Contains(err.Error(), "Config.") {
			t.Errorf("error does not name the field: %v", err)
		}
		if _, err := mysqlstore.Open("root@tcp(127.0.0.1:1)/x", cfg); err == nil {
			t.Errorf("Open(%+v) accepted", cfg)
		}
	}
	if _, err := mysqlstore.New(nil, mysqlstore.Config{}); err == nil {
		t.Error("New(nil db) accepted")
	}
}

// TestClaimRefusesInvalidKeys: INSERT IGNORE would turn a key too long for
// its column into a warning and no row; Claim refuses it first.
func TestClaimRefusesInvalidKeys(t *testing.T) {
	st, _ := newStore(t, mysqlstore.Config{})
	for _, k := range []dedup.Key{{Scope: "s", ID: strings.Repeat("x", 257)}, {Scope: "s", ID: "a\x00b"}, {Scope: "s", ID: "\xff"}} {
		err := st.InTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
			return st.Claim(ctx, tx, []dedup.Claim{{Key: k}}, make([]dedup.Result, 1))
		})
		if !errors.Is(err, dedup.ErrInvalidKey) {
			t.Errorf("claim of %q: %v, want ErrInvalidKey", k.ID, err)
		}
	}
	// Audit strings are cleaned, not refused.
	c := deduptest.Claim("s", "ok", "p")
	c.Source = "topic\x00\xff" + strings.Repeat("é", 600)
	res := make([]dedup.Result, 1)
	if err := st.InTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
		return st.Claim(ctx, tx, []dedup.Claim{c}, res)
	}); err != nil || res[0].Status != dedup.StatusNew {
		t.Fatalf("claim with a dirty source: %v %v", res[0].Status, err)
	}
	if err := st.RecordFailure(context.Background(), deduptest.Claim("s", "f", "p"), "bad\x00"+strings.Repeat("ü", 400)); err != nil {
		t.Fatalf("RecordFailure with a dirty reason: %v", err)
	}
}

func TestRetentionUsesDatabaseClock(t *testing.T) {
	st, db := newStore(t, mysqlstore.Config{Retention: time.Hour, ScopeRetention: map[string]time.Duration{"forever": 0}})
	ctx := context.Background()
	err := st.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res := make([]dedup.Result, 2)
		return st.Claim(ctx, tx, []dedup.Claim{deduptest.Claim("hour", "a", "p"), deduptest.Claim("forever", "b", "p")}, res)
	})
	if err != nil {
		t.Fatal(err)
	}
	var hourOK, foreverNull bool
	q := `SELECT
	  sum(scope = 'hour' AND expires_at BETWEEN UTC_TIMESTAMP(6) + INTERVAL 59 MINUTE AND UTC_TIMESTAMP(6) + INTERVAL 61 MINUTE) = 1,
	  sum(scope = 'forever' AND expires_at IS NULL) = 1 FROM ` + st.Table()
	if err := db.QueryRow(q).Scan(&hourOK, &foreverNull); err != nil {
		t.Fatal(err)
	}
	if !hourOK || !foreverNull {
		t.Fatalf("expiry: hour scope ok=%v, forever scope NULL=%v", hourOK, foreverNull)
	}
}

func TestClassify(t *testing.T) {
	me := func(n uint16, state string) error {
		e := &mysql.MySQLError{Number: n}
		copy(e.SQLState[:], state)
		return e
	}
	cases := []struct {
		err  error
		want dedup.ErrorClass
	}{
		{me(1205, "HY000"), dedup.ClassConflict},
		{me(1213, "40001"), dedup.ClassConflict},
		{fmt.Errorf("%w: %w", dedup.ErrInFlight, me(1205, "HY000")), dedup.ClassConflict},
		{me(1062, "23000"), dedup.ClassPermanent},
		{me(1452, "23000"), dedup.ClassPermanent},
		{me(4025, "23000"), dedup.ClassPermanent},
		{me(1406, "22001"), dedup.ClassPermanent},
		{me(1146, "42S02"), dedup.ClassFatal},
		{me(1054, "42S22"), dedup.ClassFatal},
		{me(1064, "42000"), dedup.ClassFatal},
		{me(1142, "42000"), dedup.ClassFatal},
		{me(1044, "42000"), dedup.ClassFatal},
		{me(1040, "08004"), dedup.ClassUnavailable},
		{me(1053, "08S01"), dedup.ClassUnavailable},
		{me(1927, "70100"), dedup.ClassUnavailable},
		{me(1969, "70100"), dedup.ClassRetryable},
		{me(1644, "45000"), dedup.ClassUnknown}, // SIGNAL in a trigger: the message's
		{&dedup.ConnLostError{Store: "mysqlstore", Err: mysql.ErrInvalidConn}, dedup.ClassUnavailable},
		{fmt.Errorf("wrapped: %w", &dedup.ConnLostError{Store: "mysqlstore", Err: io.ErrUnexpectedEOF}), dedup.ClassUnavailable},
		// Errors a handler gets from elsewhere are not the database going away.
		{mysql.ErrInvalidConn, dedup.ClassUnknown},
		{io.EOF, dedup.ClassUnknown},
		{context.DeadlineExceeded, dedup.ClassUnknown},
		{&url.Error{Op: "Post", URL: "http://127.0.0.1:1", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}, dedup.ClassUnknown},
		{sql.ErrTxDone, dedup.ClassUnknown},
		{errors.New("something else"), dedup.ClassUnknown},
	}
	for _, c := range cases {
		if got := mysqlstore.Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestServerErrorsClassified: the errors a real server sends are sorted as
// Classify says.
func TestServerErrorsClassified(t *testing.T) {
	st, db := newStore(t, mysqlstore.Config{})
	if _, err := db.Exec(`CREATE TABLE u (id INT PRIMARY KEY, v VARCHAR(3) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sql  string
		want dedup.ErrorClass
	}{
		{`INSERT INTO u VALUES (1, 'a'), (1, 'b')`, dedup.ClassPermanent},
		{`INSERT INTO u VALUES (2, 'toolong')`, dedup.ClassPermanent},
		{`INSERT INTO no_such_table VALUES (1)`, dedup.ClassFatal},
		{`SELECT no_such_column FROM u`, dedup.ClassFatal},
		{`SELEC 1`, dedup.ClassFatal},
	} {
		err := st.InTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, tc.sql)
			return err
		})
		if got := st.ClassifyError(err); got != tc.want {
			t.Errorf("%s: %v classified %v, want %v", tc.sql, err, got, tc.want)
		}
	}
}

// TestInTxContextErrorIsNotConnLost: the driver interrupts a statement whose
// context ends by closing the connection. When that context is fn's own (a
// handler's timeout), InTx does not report a lost connection; when the
// server kills the connection, it does.
func TestInTxContextErrorIsNotConnLost(t *testing.T) {
	st, db := newStore(t, mysqlstore.Config{})
	cases := []struct {
		name     string
		fn       func(ctx context.Context, tx *sql.Tx) error
		lost     bool
		ctxError error
	}{
		{"deadline", func(ctx context.Context, tx *sql.Tx) error {
			ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err := tx.ExecContext(ctx, `DO SLEEP(5)`)
			return err
		}, false, context.DeadlineExceeded},
		{"connection killed", func(ctx context.Context, tx *sql.Tx) error {
			var id int64
			if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
				return err
			}
			if _, err := db.ExecContext(ctx, fmt.Sprintf(`KILL CONNECTION %d`, id)); err != nil {
				return consumer.Permanent(err)
			}
			_, err := tx.ExecContext(ctx, `DO 1`)
			return err
		}, true, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := st.InTx(context.Background(), c.fn)
			if err == nil {
				t.Fatal("InTx succeeded: the case proves nothing")
			}
			var lost *dedup.ConnLostError
			if errors.As(err, &lost) != c.lost {
				t.Fatalf("InTx: %v; want ConnLostError %v", err, c.lost)
			}
			if c.ctxError != nil && !errors.Is(err, c.ctxError) {
				t.Fatalf("InTx: %v; want %v", err, c.ctxError)
			}
			if got := mysqlstore.Classify(err); (got == dedup.ClassUnavailable) != c.lost {
				t.Fatalf("Classify(%v) = %v", err, got)
			}
		})
	}
}

// TestRunRefusesAStoreThatWasNeverMigrated: the consumer stops with
// ErrNotMigrated instead of retrying "no such table" for ever.
func TestRunRefusesAStoreThatWasNeverMigrated(t *testing.T) {
	db, _ := testDB(t, mysqlstore.Config{})
	st, err := mysqlstore.New(db, mysqlstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = consumertest.Drive(ctx, consumer.Config[*sql.Tx]{
		Name: "payments", Store: st, Key: consumer.ByMessageID(), Logger: quiet,
		Handler: consumer.HandlerFunc[*sql.Tx](func(context.Context, *sql.Tx, *consumer.Message) error { return nil }),
	}, consumertest.Script{}, consumertest.Message("payments", 0, 0, "", `{}`))
	if !errors.Is(err, dedup.ErrNotMigrated) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Drive: %v, want dedup.ErrNotMigrated naming Migrate", err)
	}
}

// TestMissingBusinessTableStopsTheConsumer: a handler's missing table (1146)
// is a broken deployment, not a bad message: nothing dead-lettered or acked.
func TestMissingBusinessTableStopsTheConsumer(t *testing.T) {
	st, _ := newStore(t, mysqlstore.Config{})
	src := consumertest.NewSource(consumertest.Script{})
	m := consumertest.Message("payments", 0, 0, "", `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := consumertest.Drive(ctx, consumer.Config[*sql.Tx]{
		Name: "payments", Source: src, Store: st, Key: consumer.ByMessageID(), Logger: quiet,
		Handler: consumer.HandlerFunc[*sql.Tx](func(ctx context.Context, tx *sql.Tx, _ *consumer.Message) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger VALUES (1)`)
			return err
		}),
	}, consumertest.Script{}, m)
	if err == nil || !strings.Contains(err.Error(), "1146") {
		t.Fatalf("Drive: %v, want Run to stop with the missing table", err)
	}
	if src.Acked(m.ID) != 0 || len(res.DeadLetters) != 0 {
		t.Errorf("acked %d, dead letters %v", src.Acked(m.ID), res.DeadLetters)
	}
}

func TestEpochsConformance(t *testing.T) {
	deduptest.RunEpochs(t, func(t *testing.T) dedup.EpochStore {
		st, _ := newStore(t, mysqlstore.Config{})
		return st
	})
}
