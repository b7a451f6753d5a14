package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MySQLDSN returns IDEM_TEST_MYSQL_DSN (go-sql-driver/mysql's format), or
// skips (fails under CI) when it is unset. The test shares the server with
// other tests until it ends; see MySQLExclusive.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	return useService(t, "IDEM_TEST_MYSQL_DSN", "mariadb", false)
}

// MySQLExclusive is MySQLDSN for a test that kills or restarts the server:
// it waits until no other test (in any package's test process) uses it, and
// keeps the others out until it ends.
func MySQLExclusive(t testing.TB) string {
	t.Helper()
	return useService(t, "IDEM_TEST_MYSQL_DSN", "mariadb", true)
}

// MySQLDatabase creates a fresh database for one test on the server of dsn,
// drops it when the test ends, and returns dsn pointing at it: tests in
// separate databases run in parallel.
func MySQLDatabase(t testing.TB, dsn string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("IDEM_TEST_MYSQL_DSN: %v", err)
	}
	name := fmt.Sprintf("t_%s_%d_%d", sanitize(t.Name()), os.Getpid(), seq.Add(1))
	if len(name) > 64 {
		name = fmt.Sprintf("t_%d_%d_%d", time.Now().UnixNano()%1e9, os.Getpid(), seq.Add(1))
	}
	admin := cfg.Clone()
	admin.DBName = ""
	db, err := sql.Open("mysql", admin.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4"); err != nil {
		t.Fatalf("mysql at %s: create database: %v", cfg.Addr, err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", admin.FormatDSN())
		if err != nil {
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// RedisAddr returns IDEM_TEST_REDIS_ADDR (host:port), or skips (fails under
// CI) when it is unset. The test shares the server with other tests until it
// ends; see RedisExclusive.
func RedisAddr(t testing.TB) string {
	t.Helper()
	return useService(t, "IDEM_TEST_REDIS_ADDR", "redis", false)
}

// RedisExclusive is RedisAddr for a test that kills, flushes or pauses the
// server.
func RedisExclusive(t testing.TB) string {
	t.Helper()
	return useService(t, "IDEM_TEST_REDIS_ADDR", "redis", true)
}
