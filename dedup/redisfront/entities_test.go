package redisfront_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/deduptest"
	"github.com/idemkit/idem/dedup/redisfront"
)

// TestEntityRefusedInFront: a consumer with Config.Entity over a Redis
// front of pgstore is refused by New, with an error that names the
// front and the field, before any message is consumed: the front keeps
// no entity watermarks (its answers skip the database, where they live).
func TestEntityRefusedInFront(t *testing.T) {
	st := front(t, dedup.Store[pgx.Tx](postgresInner(t, deduptest.Config{})), redisfront.Config{Client: newClient(t)})
	_, err := consumer.New(consumer.Config[pgx.Tx]{
		Name: "alipay", Source: consumertest.NewSource(consumertest.Script{}), DeadLetter: &consumertest.DeadLetters{}, Store: st, Key: consumer.ByMessageID(),
		Entity:  func(*consumer.Message) (consumer.Entity, error) { return consumer.Entity{Name: "T1"}, nil },
		Handler: consumer.HandlerFunc[pgx.Tx](func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
	})
	if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), "Config.Entity") || !strings.Contains(err.Error(), "redisfront") {
		t.Fatalf("New: %v, want a refusal naming Entity and the front", err)
	}
	t.Log(err)
}
