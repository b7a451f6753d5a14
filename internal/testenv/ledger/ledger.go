// Package ledger is the workload the stores' fault tests run the consumer
// on: credits to accounts, each booked once as a ledger row and added to its
// account's balance in the consumer's transaction, with the duplicates a
// producer's retries make and the bad and conflicting messages a real queue
// carries. Reconcile checks that the two tables and the store's dedup table
// agree.
//
// It is the stores' own workload, so that their tests import no example;
// examples/payments is the application people copy and the fault suite
// (internal/testenv/faults) tests. The SQL uses ? placeholders and no
// upsert: it runs on SQLite and on MySQL or MariaDB through database/sql.
package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/consumer/consumertest"
)

// Credit is what a message carries: an amount for an account, under an ID
// the producer chose (the dedup key).
type Credit struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"` // minor units, positive
}

// KeyField is the JSON field the consumer deduplicates on
// (consumer.ByJSONField).
const KeyField = "id"

// MaxPayload is the payload limit the tests configure; the stream's
// oversized messages exceed it.
const MaxPayload = 64 << 10

// ErrBadCredit: the credit cannot be booked, whatever the retries.
var ErrBadCredit = errors.New("ledger: bad credit")

// Stream is a generated run of credits.
type Stream struct {
	Accounts []string
	Payloads [][]byte // in send order, duplicates and bad messages included
	Expected []Credit // every valid credit, once
	// What was mixed in:
	Resent      int // the same credit sent again (right away, or three times later, spelled differently)
	Bad         int // invalid JSON, no id, oversized, a zero amount
	Conflicting int // an earlier id with another amount (fingerprint mismatch)
}

// Generate builds a stream of n credits over 20 accounts, reproducible
// from seed.
func Generate(n int, seed uint64) Stream {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	var s Stream
	for i := range 20 {
		s.Accounts = append(s.Accounts, fmt.Sprintf("acct-%02d", i))
	}
	insert := func(at int, p []byte) {
		s.Payloads = append(s.Payloads[:at], append([][]byte{p}, s.Payloads[at:]...)...)
	}
	for i := range n {
		c := Credit{ID: fmt.Sprintf("c-%08d", i), Account: s.Accounts[rng.IntN(len(s.Accounts))], Amount: int64(100 + rng.IntN(100000))}
		s.Expected = append(s.Expected, c)
		p, _ := json.Marshal(c)
		s.Payloads = append(s.Payloads, p)
		switch r := rng.IntN(100); {
		case r < 10: // a producer's retry: the same body, right behind
			s.Payloads = append(s.Payloads, p)
			s.Resent++
		case r < 15: // sent again three times, later, from another server
			s.Resent++
			for range 3 {
				insert(len(s.Payloads)-rng.IntN(min(len(s.Payloads), 50)), reformat(p))
			}
		}
	}
	for i := 0; i < max(1, n/200); i++ {
		insert(rng.IntN(len(s.Payloads)+1), []byte(`{"id":"c-`+fmt.Sprint(i)+`","account":`)) // truncated JSON
		insert(rng.IntN(len(s.Payloads)+1), []byte(`{"account":"acct-00","amount":100}`))
		insert(rng.IntN(len(s.Payloads)+1), []byte(`{"id":"big-`+fmt.Sprint(i)+`","pad":"`+strings.Repeat("x", MaxPayload)+`"}`))
		insert(rng.IntN(len(s.Payloads)+1), []byte(`{"id":"zero-`+fmt.Sprint(i)+`","account":"acct-00","amount":0}`))
		s.Bad += 4
		// An earlier id with another amount: must not be booked.
		c := s.Expected[rng.IntN(len(s.Expected))]
		c.Amount++
		p, _ := json.Marshal(c)
		s.Payloads = append(s.Payloads, p)
		s.Conflicting++
	}
	return s
}

// reformat spells the same credit differently (key order, spacing): the
// fingerprint is the same.
func reformat(p []byte) []byte {
	var m map[string]any
	_ = json.Unmarshal(p, &m)
	out, _ := json.MarshalIndent(m, "", "  ")
	return out
}

// Messages puts payloads on four partitions of topic by account, as a
// producer keyed by account would, with consecutive offsets per partition.
func Messages(topic string, payloads [][]byte) []*consumer.Message {
	var msgs []*consumer.Message
	offsets := map[int32]int64{}
	for _, p := range payloads {
		var c struct {
			Account string `json:"account"`
		}
		_ = json.Unmarshal(p, &c)
		part := int32(0)
		for _, r := range c.Account {
			part = (part*31 + r) % 4
		}
		msgs = append(msgs, consumertest.Message(topic, part, offsets[part], c.Account, string(p)))
		offsets[part]++
	}
	return msgs
}

var schema = []string{
	`CREATE TABLE IF NOT EXISTS accounts (
    id      VARCHAR(100) PRIMARY KEY,
    balance BIGINT NOT NULL DEFAULT 0
)`,
	`CREATE TABLE IF NOT EXISTS ledger (
    id      VARCHAR(100) PRIMARY KEY,
    account VARCHAR(100) NOT NULL,
    amount  BIGINT NOT NULL,
    FOREIGN KEY (account) REFERENCES accounts (id)
)`,
}

// Setup creates the tables and the accounts, at a balance of 0.
func Setup(ctx context.Context, db *sql.DB, accounts []string) error {
	for _, stmt := range schema {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("ledger: setup: %w", err)
		}
	}
	for _, a := range accounts {
		if _, err := db.ExecContext(ctx, `INSERT INTO accounts (id) VALUES (?)`, a); err != nil {
			return fmt.Errorf("ledger: account %s: %w", a, err)
		}
	}
	return nil
}

// Handler books a credit in tx: a ledger row and the account's balance. It
// never commits.
func Handler() consumer.Handler[*sql.Tx] {
	return consumer.HandlerFunc[*sql.Tx](func(ctx context.Context, tx *sql.Tx, m *consumer.Message) error {
		var c Credit
		if err := json.Unmarshal(m.Value, &c); err != nil {
			return consumer.Permanent(fmt.Errorf("%w: %v", ErrBadCredit, err))
		}
		if c.Amount <= 0 {
			return consumer.Permanent(fmt.Errorf("%w: amount %d is not positive", ErrBadCredit, c.Amount))
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO ledger (id, account, amount) VALUES (?, ?, ?)`, c.ID, c.Account, c.Amount); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ?`, c.Amount, c.Account)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n != 1 {
			return consumer.Permanent(fmt.Errorf("%w: account %q does not exist", ErrBadCredit, c.Account))
		}
		return nil
	})
}

// Report is the outcome of Reconcile. Every count but the totals must be 0.
type Report struct {
	Entries       int64 // ledger rows
	Credited      int64 // sum of balances
	Lost          int64 // expected credits with no ledger row of their account and amount
	DoubleApplied int64 // accounts whose balance differs from their ledger sum
	Unexpected    int64 // ledger rows nobody expected
	LedgerNoDedup int64 // ledger rows without a committed dedup row
	DedupNoLedger int64 // committed dedup rows without a ledger row
	Problems      []string
}

// OK reports whether the tables agree.
func (r Report) OK() bool { return len(r.Problems) == 0 }

func (r Report) String() string {
	if r.OK() {
		return fmt.Sprintf("reconciled: %d entries, %d credited", r.Entries, r.Credited)
	}
	return "NOT reconciled: " + strings.Join(r.Problems, "; ")
}

// Reconcile cross-checks the ledger, the accounts and the store's dedup
// table (dedupTable, qualified and quoted as the store names it, holding the
// keys of scope). expected lists every valid credit sent.
func Reconcile(ctx context.Context, db *sql.DB, dedupTable, scope string, expected []Credit) (Report, error) {
	var r Report
	q := func(dst *int64, query string, args ...any) error {
		if err := db.QueryRowContext(ctx, query, args...).Scan(dst); err != nil {
			return fmt.Errorf("ledger: reconcile: %w", err)
		}
		return nil
	}
	if err := q(&r.Entries, `SELECT count(*) FROM ledger`); err != nil {
		return r, err
	}
	if err := q(&r.Credited, `SELECT coalesce(sum(balance), 0) FROM accounts`); err != nil {
		return r, err
	}
	seen := make(map[string]bool, len(expected))
	for _, c := range expected {
		if seen[c.ID] {
			return r, fmt.Errorf("ledger: reconcile: %s is expected twice", c.ID)
		}
		seen[c.ID] = true
		var n int64
		if err := q(&n, `SELECT count(*) FROM ledger WHERE id = ? AND account = ? AND amount = ?`, c.ID, c.Account, c.Amount); err != nil {
			return r, err
		}
		if n != 1 {
			r.Lost++
		}
	}
	r.Unexpected = r.Entries - (int64(len(expected)) - r.Lost)
	checks := []struct {
		dst   *int64
		query string
		args  []any
	}{
		{&r.DoubleApplied, `SELECT count(*) FROM accounts a
    WHERE a.balance <> (SELECT coalesce(sum(l.amount), 0) FROM ledger l WHERE l.account = a.id)`, nil},
		{&r.LedgerNoDedup, `SELECT count(*) FROM ledger l WHERE NOT EXISTS
    (SELECT 1 FROM ` + dedupTable + ` d WHERE d.scope = ? AND d.key = l.id AND d.outcome = 'done')`, []any{scope}},
		{&r.DedupNoLedger, `SELECT count(*) FROM ` + dedupTable + ` d WHERE d.scope = ? AND d.outcome = 'done'
    AND NOT EXISTS (SELECT 1 FROM ledger l WHERE l.id = d.key)`, []any{scope}},
	}
	for _, c := range checks {
		if err := q(c.dst, c.query, c.args...); err != nil {
			return r, err
		}
	}
	add := func(n int64, what string) {
		if n != 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(r.Lost, "lost credits")
	add(r.DoubleApplied, "accounts that disagree with the ledger (double effect)")
	add(r.Unexpected, "unexpected ledger rows")
	add(r.LedgerNoDedup, "ledger rows without a dedup row")
	add(r.DedupNoLedger, "dedup rows without a ledger row")
	return r, nil
}

// Balances reads every account's balance.
func Balances(ctx context.Context, db *sql.DB) (map[string]int64, error) {
	rows, err := db.QueryContext(ctx, `SELECT id, balance FROM accounts`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var b int64
		if err := rows.Scan(&id, &b); err != nil {
			return nil, err
		}
		out[id] = b
	}
	return out, rows.Err()
}
