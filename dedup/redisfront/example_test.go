package redisfront_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/mysqlstore"
	"github.com/idemkit/idem/dedup/redisfront"
)

// Redis in front of a MySQL store, for a stream where most messages are
// duplicates; the consumer is given the front as its store. Retention is
// the store's. (Not run: it needs a database and Redis.)
func Example() {
	cfg := mysqlstore.Config{Retention: 7 * 24 * time.Hour}
	db, err := mysqlstore.Open(os.Getenv("MYSQL_DSN"), cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := mysqlstore.New(db, cfg)
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR"), ContextTimeoutEnabled: true})
	defer rdb.Close()
	front, err := redisfront.New(dedup.Store[*sql.Tx](store), redisfront.Config{
		Client:    rdb,
		Retention: cfg.Retention, // entries expire with their rows
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = consumer.Config[*sql.Tx]{Name: "callbacks", Store: front, Key: consumer.ByJSONField("txn_id")}
}

// An operator's tool runs a failed key again: the row is deleted inside a
// release of its scope (recorded in the database), so that no consumer
// answers it from Redis afterwards, whatever Redis keeps or loses.
// (Not run: it needs a database and Redis.)
func ExampleStore_Release() {
	var front *redisfront.Store[*sql.Tx] // as in Example
	var db *sql.DB
	key := dedup.Key{Scope: "callbacks", ID: "4200000001"}
	err := front.Release(context.Background(), []dedup.Key{key}, func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, "DELETE FROM idem_dedup WHERE scope = ? AND `key` = ? AND outcome = 'failed'", key.Scope, key.ID)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}
