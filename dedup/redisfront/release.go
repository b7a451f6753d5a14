package redisfront

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/dedup"
)

// Release runs a key again: it tombstones the keys in Redis (for
// Config.ReleaseHold), calls deleteRows — which deletes the keys' rows from
// the store's table, with whatever the operator's tool uses — and tombstones
// them again, now for twice Config.WriteWindow: a transaction that read a
// row before deleteRows deleted it cannot write its entry back. Claims of
// tombstoned keys go to the database. When Redis cannot be reached, the rows
// are not deleted and the error says so; when the second tombstones fail,
// the rows are deleted and the error says to call Forget.
func (s *Store[TTx]) Release(ctx context.Context, keys []dedup.Key, deleteRows func(ctx context.Context) error) error {
	if err := s.tombstone(ctx, keys, s.cfg.ReleaseHold+2*s.cfg.WriteWindow); err != nil {
		return fmt.Errorf("redisfront: release: nothing deleted: %w", err)
	}
	if err := deleteRows(ctx); err != nil {
		return fmt.Errorf("redisfront: release: deleting the rows: %w", err)
	}
	if err := s.Forget(ctx, keys...); err != nil {
		return fmt.Errorf("redisfront: release: the rows are deleted, but Redis may still answer them as duplicates: call Forget: %w", err)
	}
	return nil
}

// Forget tombstones keys whose rows were deleted (call it after deleting
// them), for twice Config.WriteWindow; see Release.
func (s *Store[TTx]) Forget(ctx context.Context, keys ...dedup.Key) error {
	return s.tombstone(ctx, keys, 2*s.cfg.WriteWindow)
}

func (s *Store[TTx]) tombstone(ctx context.Context, keys []dedup.Key, ttl time.Duration) error {
	if len(keys) == 0 {
		return nil
	}
	pipe := s.rdb.Pipeline()
	for _, k := range keys {
		pipe.Set(ctx, s.entryKey(k), tombstone, ttl)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// ReleaseScope is Release for every key of scope: a tombstone of the scope
// stands while deleteRows runs, then every entry of the scope is deleted
// (SCAN), and the scope's tombstone stays for twice Config.WriteWindow.
func (s *Store[TTx]) ReleaseScope(ctx context.Context, scope string, deleteRows func(ctx context.Context) error) error {
	if err := s.rdb.Set(ctx, s.scopeKey(scope), tombstone, s.cfg.ReleaseHold+2*s.cfg.WriteWindow).Err(); err != nil {
		return fmt.Errorf("redisfront: release scope: nothing deleted: %w", err)
	}
	if err := deleteRows(ctx); err != nil {
		return fmt.Errorf("redisfront: release scope: deleting the rows: %w", err)
	}
	if err := s.ForgetScope(ctx, scope); err != nil {
		return fmt.Errorf("redisfront: release scope: the rows are deleted, but Redis may still answer them as duplicates: call ForgetScope: %w", err)
	}
	return nil
}

// ForgetScope deletes every entry of scope (call it after deleting the
// scope's rows): a tombstone of the scope stands meanwhile and for twice
// Config.WriteWindow after. It scans the keyspace: an operator's tool, not
// a hot path.
func (s *Store[TTx]) ForgetScope(ctx context.Context, scope string) error {
	tomb := s.scopeKey(scope)
	if err := s.rdb.Set(ctx, tomb, tombstone, s.cfg.ReleaseHold+2*s.cfg.WriteWindow).Err(); err != nil {
		return err
	}
	match := globEscape(s.scopeTag(scope)+"k") + "*"
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		it := c.Scan(ctx, 0, match, 1000).Iterator()
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			err := c.Unlink(ctx, batch...).Err()
			batch = batch[:0]
			return err
		}
		for it.Next(ctx) {
			if batch = append(batch, it.Val()); len(batch) == 500 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		return flush()
	}
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.rdb)
	}
	if err != nil {
		return err
	}
	return s.rdb.Set(ctx, tomb, tombstone, 2*s.cfg.WriteWindow).Err()
}

// globEscape escapes the characters SCAN's MATCH pattern treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
