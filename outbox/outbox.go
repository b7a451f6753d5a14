package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/storekit/sqlmigrate"
)

// Headers the relay puts on every message it publishes, after the message's
// own. A downstream consumer keys by HeaderID:
//
//	consumer.Config[pgx.Tx]{Key: consumer.ByHeader(outbox.HeaderID), ...}
const (
	HeaderID       = "idem-outbox-id"       // MessageID(parent, position): the message's identity
	HeaderScope    = "idem-outbox-scope"    // the parent key's scope: the consumer (and tenant) that produced it
	HeaderKey      = "idem-outbox-key"      // the parent key's ID
	HeaderPosition = "idem-outbox-position" // the message's position among its parent's, decimal from 0
	// HeaderPrefix is reserved: a Message's own headers must not start with it.
	HeaderPrefix = "idem-outbox-"
)

// shardCount is how many relay locks the outbox is divided into. A message's
// shard is a hash of its topic and key, so all messages of one key are in
// one shard and one relay at a time publishes them, in order.
const shardCount = 16

// Message is an outgoing message, written by Enqueue in the handler's
// transaction and published by a Relay after it committed.
type Message struct {
	// Topic is the destination topic. Required; 1 to 249 bytes of
	// letters, digits and . _ - % | (what Kafka or RocketMQ allow; each
	// publisher refuses the names its broker does not).
	Topic string
	// Key is the Kafka record key or RocketMQ's Keys, and the order key:
	// messages with the same Topic and Key are published in the order they
	// were enqueued (transactions that write the same rows serialise, so
	// for them that is commit order). Nil: no order is kept.
	Key []byte
	// Value is the payload.
	Value []byte
	// Headers are Kafka headers or RocketMQ user properties. Names must not
	// be empty, contain control characters or start with HeaderPrefix.
	Headers []consumer.Header
}

// Config configures an Outbox. Zero values take the defaults.
type Config struct {
	// Schema holds the tables; default "public". Created by Migrate.
	Schema string
	// Table is the outbox table; default "idem_outbox". Refused messages go
	// to Table + "_dead". Schema and Table must match [a-z_][a-z0-9_]* and
	// be at most 48 bytes.
	Table string
}

// Outbox writes outgoing messages into a table in the caller's transaction.
// Safe for concurrent use.
type Outbox struct {
	pool   *pgxpool.Pool
	cfg    Config
	table  string // sanitized schema.table
	dead   string // sanitized schema.table_dead
	lockID int32  // the relay's advisory lock class for this table

	insertSQL string // EnqueueAll's: arrays, any number of parents

	mu        sync.Mutex
	valuesSQL map[int]string // EnqueueFor's, per number of messages
}

// New returns an Outbox on pool. Call Migrate before the first Enqueue.
func New(pool *pgxpool.Pool, cfg Config) (*Outbox, error) {
	if pool == nil {
		return nil, errors.New("outbox: pool is nil")
	}
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.Table == "" {
		cfg.Table = "idem_outbox"
	}
	if err := sqlmigrate.CheckName("outbox", "Schema", cfg.Schema); err != nil {
		return nil, err
	}
	if err := sqlmigrate.CheckName("outbox", "Table", cfg.Table); err != nil {
		return nil, err
	}
	h := fnv.New32a()
	h.Write([]byte("idem.outbox:" + cfg.Schema + "." + cfg.Table))
	o := &Outbox{
		pool:      pool,
		cfg:       cfg,
		table:     pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(),
		dead:      pgx.Identifier{cfg.Schema, cfg.Table + "_dead"}.Sanitize(),
		lockID:    int32(h.Sum32()),
		valuesSQL: map[int]string{},
	}
	// Positions: the count of rows this transaction wrote under the parent
	// before (LATERAL, one index probe per row; rows of this statement are
	// not in its snapshot) plus the row's index among its parent's in this
	// call, numbered in Go. Postgres plans it afresh each time (the array
	// sizes make a custom plan look cheaper than the generic one), a cost
	// a batch's worth of messages shares.
	o.insertSQL = `INSERT INTO ` + o.table + ` (id, parent_scope, parent_key, position, shard, topic, key, value, header_keys, header_values)
SELECT left(encode(sha256(convert_to('idem-outbox' || chr(31) || u.scope || chr(31) || u.pkey || chr(31) || (b.n + u.i)::text, 'UTF8')), 'hex'), 32),
       u.scope, u.pkey, b.n + u.i, u.shard, u.topic, u.key, u.value,
       ($10::text[])[u.h0 + 1 : u.h0 + u.hc], ($11::bytea[])[u.h0 + 1 : u.h0 + u.hc]
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::bytea[], $6::int2[], $7::int4[], $8::int4[], $9::int4[])
    WITH ORDINALITY AS u(scope, pkey, topic, key, value, shard, i, h0, hc, ord)
CROSS JOIN LATERAL (SELECT count(*)::int AS n FROM ` + o.table + ` t
    WHERE t.parent_scope = u.scope AND t.parent_key = u.pkey AND t.tx = pg_current_xact_id()) AS b
ORDER BY u.ord
ON CONFLICT (parent_scope, parent_key, position) DO UPDATE SET tx = EXCLUDED.tx`
	return o, nil
}

// Table returns the sanitized, schema-qualified outbox table.
func (o *Outbox) Table() string { return o.table }

// DeadTable returns the sanitized, schema-qualified table of refused
// messages.
func (o *Outbox) DeadTable() string { return o.dead }

// MessageID is the identity of the message at position (from 0, in the
// order of Enqueue calls) among those enqueued in one transaction under
// parent: the first 32 hex digits of SHA-256 over "idem-outbox", parent's
// scope and ID and the decimal position, joined by U+001F (which valid keys
// cannot contain). The same work re-run — a redelivery the dedup row would
// have skipped, a retry after a rollback — gives the same IDs, so a
// downstream consumer keyed by HeaderID applies each message once however
// often it is published.
func MessageID(parent dedup.Key, position int) string {
	sum := sha256.Sum256([]byte("idem-outbox\x1f" + parent.Scope + "\x1f" + parent.ID + "\x1f" + strconv.Itoa(position)))
	return hex.EncodeToString(sum[:16])
}

// Enqueue writes msgs into the outbox in tx, the transaction the consumer
// gave the handler of from: they commit with the handler's effects and
// from's dedup row, or not at all. Their identities derive from from's
// dedup key (see MessageID), numbered on from the messages enqueued under
// it earlier in tx. A message already in the outbox with the same identity
// (the parent's work ran again after its dedup row was purged) is kept as it
// is, not added twice.
//
// An invalid message is a programming error, returned wrapped in
// consumer.Permanent: the message from is dead-lettered, not retried.
func (o *Outbox) Enqueue(ctx context.Context, tx pgx.Tx, from *consumer.Message, msgs ...Message) error {
	if from == nil {
		return consumer.Permanent(errors.New("outbox: Enqueue without the message being handled"))
	}
	k, ok := from.DedupKey()
	if !ok {
		return consumer.Permanent(fmt.Errorf("outbox: message %s has no dedup key: Enqueue in a handler the consumer called, or use EnqueueFor", from.Coordinates()))
	}
	return o.EnqueueFor(ctx, tx, k, msgs...)
}

// EnqueueFor is Enqueue for work that did not come from a consumer — an
// HTTP request deduplicated by its Idempotency-Key, a scheduled job — with
// the key that names that work once: parent's scope and ID are the
// messages' lineage and identity.
func (o *Outbox) EnqueueFor(ctx context.Context, tx pgx.Tx, parent dedup.Key, msgs ...Message) error {
	if err := parent.Validate(); err != nil {
		return consumer.Permanent(fmt.Errorf("outbox: parent key: %w", err))
	}
	for i := range msgs {
		if err := msgs[i].validate(); err != nil {
			return consumer.Permanent(fmt.Errorf("outbox: message %d: %w", i, err))
		}
	}
	for len(msgs) > 0 {
		n := min(len(msgs), maxPerStatement)
		if _, err := tx.Exec(ctx, o.values(n), valuesArgs(parent, msgs[:n])...); err != nil {
			return fmt.Errorf("outbox: enqueue: %w", err)
		}
		msgs = msgs[n:]
	}
	return nil
}

const (
	maxPerStatement = 100
	perMessage      = 6 // parameters per message
)

// values returns the INSERT of n messages under one parent ($1, $2), the
// rest of the parameters a VALUES list: no arrays, so that after five runs
// Postgres keeps one generic plan instead of planning every call. Positions
// go on from the rows this transaction wrote under the parent before.
func (o *Outbox) values(n int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if s, ok := o.valuesSQL[n]; ok {
		return s
	}
	var b strings.Builder
	b.WriteString(`WITH base AS (
    SELECT count(*)::int AS n FROM ` + o.table + `
    WHERE parent_scope = $1 AND parent_key = $2 AND tx = pg_current_xact_id())
INSERT INTO ` + o.table + ` (id, parent_scope, parent_key, position, shard, topic, key, value, header_keys, header_values)
SELECT left(encode(sha256(convert_to('idem-outbox' || chr(31) || $1::text || chr(31) || $2::text || chr(31) || (base.n + v.i)::text, 'UTF8')), 'hex'), 32),
       $1, $2, base.n + v.i, v.shard, v.topic, v.key, v.value, v.hk, v.hv
FROM base, (VALUES `)
	for i := range n {
		p := 3 + perMessage*i
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "($%d::text, $%d::bytea, $%d::bytea, $%d::text[], $%d::bytea[], $%d::smallint, %d)", p, p+1, p+2, p+3, p+4, p+5, i)
	}
	b.WriteString(`) AS v(topic, key, value, hk, hv, shard, i)
ORDER BY v.i
ON CONFLICT (parent_scope, parent_key, position) DO UPDATE SET tx = EXCLUDED.tx`)
	s := b.String()
	o.valuesSQL[n] = s
	return s
}

// valuesArgs lays msgs out as values' parameters.
func valuesArgs(parent dedup.Key, msgs []Message) []any {
	args := make([]any, 0, 2+perMessage*len(msgs))
	args = append(args, parent.Scope, parent.ID)
	for _, m := range msgs {
		hk, hv := make([]string, len(m.Headers)), make([][]byte, len(m.Headers))
		for j, h := range m.Headers {
			hk[j], hv[j] = h.Key, h.Value
			if hv[j] == nil {
				hv[j] = []byte{}
			}
		}
		args = append(args, m.Topic, m.Key, m.Value, hk, hv, shardOf(parent, m))
	}
	return args
}

// Outgoing is what one handled message sends, for EnqueueAll.
type Outgoing struct {
	From     *consumer.Message
	Messages []Message
}

// EnqueueAll is Enqueue for many handled messages at once — a
// BatchHandler's — in one statement. The messages of each Outgoing are
// numbered as Enqueue numbers them; one From may appear more than once, its
// messages numbered on in order.
func (o *Outbox) EnqueueAll(ctx context.Context, tx pgx.Tx, out []Outgoing) error {
	var rows insertRows
	for i, og := range out {
		if og.From == nil {
			return consumer.Permanent(fmt.Errorf("outbox: Outgoing %d has no From", i))
		}
		parent, ok := og.From.DedupKey()
		if !ok {
			return consumer.Permanent(fmt.Errorf("outbox: message %s has no dedup key: EnqueueAll in a handler the consumer called", og.From.Coordinates()))
		}
		for j := range og.Messages {
			if err := og.Messages[j].validate(); err != nil {
				return consumer.Permanent(fmt.Errorf("outbox: message %d of Outgoing %d: %w", j, i, err))
			}
		}
		rows.add(parent, og.Messages)
	}
	return o.insert(ctx, tx, &rows)
}

// insertRows are the INSERT's parameters: one array per column, the
// headers of all messages in two flat arrays with a count per message.
type insertRows struct {
	scopes, pkeys, topics []string
	keys, values          [][]byte
	shards                []int16
	idx                   []int32 // the row's index among its parent's in this call
	hstart, hcounts       []int32
	hkeys                 []string
	hvalues               [][]byte
	seen                  map[dedup.Key]int32
}

func (r *insertRows) add(parent dedup.Key, msgs []Message) {
	if r.seen == nil {
		r.seen = map[dedup.Key]int32{}
	}
	for _, m := range msgs {
		r.scopes, r.pkeys, r.topics = append(r.scopes, parent.Scope), append(r.pkeys, parent.ID), append(r.topics, m.Topic)
		r.keys, r.values = append(r.keys, m.Key), append(r.values, m.Value)
		r.shards, r.idx = append(r.shards, shardOf(parent, m)), append(r.idx, r.seen[parent])
		r.seen[parent]++
		r.hstart, r.hcounts = append(r.hstart, int32(len(r.hkeys))), append(r.hcounts, int32(len(m.Headers)))
		for _, h := range m.Headers {
			v := h.Value
			if v == nil {
				v = []byte{}
			}
			r.hkeys, r.hvalues = append(r.hkeys, h.Key), append(r.hvalues, v)
		}
	}
}

// insert writes rows in one statement.
func (o *Outbox) insert(ctx context.Context, tx pgx.Tx, r *insertRows) error {
	if len(r.scopes) == 0 {
		return nil
	}
	if r.hkeys == nil {
		r.hkeys, r.hvalues = []string{}, [][]byte{}
	}
	if _, err := tx.Exec(ctx, o.insertSQL, r.scopes, r.pkeys, r.topics, r.keys, r.values, r.shards, r.idx, r.hstart, r.hcounts, r.hkeys, r.hvalues); err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
	}
	return nil
}

// shardOf hashes the message's topic and key; a message without a key goes
// with its parent's other keyless messages.
func shardOf(parent dedup.Key, m Message) int16 {
	h := fnv.New32a()
	if m.Key == nil {
		h.Write([]byte("\x00" + parent.Scope + "\x1f" + parent.ID))
	} else {
		h.Write([]byte(m.Topic + "\x1f"))
		h.Write(m.Key)
	}
	return int16(h.Sum32() % shardCount)
}

func (m *Message) validate() error {
	if m.Topic == "" || len(m.Topic) > 249 {
		return fmt.Errorf("topic %q: want 1 to 249 bytes", m.Topic)
	}
	for _, r := range m.Topic {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-%|", r)) {
			return fmt.Errorf("topic %q: %q is neither a letter, a digit nor one of . _ - %% |", m.Topic, r)
		}
	}
	for _, h := range m.Headers {
		switch {
		case h.Key == "":
			return errors.New("a header has no name")
		case strings.HasPrefix(h.Key, HeaderPrefix):
			return fmt.Errorf("header %q: names starting with %q are the relay's", h.Key, HeaderPrefix)
		case !utf8.ValidString(h.Key) || strings.IndexFunc(h.Key, unicode.IsControl) >= 0:
			return fmt.Errorf("header %q: not UTF-8 without control characters", h.Key)
		}
	}
	return nil
}
