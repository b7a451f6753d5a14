package channels

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem/dedup"
)

// Order is an order waiting for its payment.
type Order struct {
	ID       string `json:"id"`
	Account  string `json:"account"`
	SKU      string `json:"sku"`
	Amount   int64  `json:"amount"`   // minor units
	Currency string `json:"currency"` // ISO 4217
}

// Outcome is what the consumer does with one delivery.
type Outcome string

const (
	Applied      Outcome = "applied"     // a new event that moved its order
	Recorded     Outcome = "recorded"    // a new event that did not move its order (informational): recorded
	Stale        Outcome = "stale"       // a new event older than one applied to its order: acknowledged, never applied (consumer.Config.Entity)
	Duplicate    Outcome = "duplicate"   // an event seen before: skipped
	DeadLettered Outcome = "dead-letter" // see Reason
)

// Reason says why a delivery is dead-lettered.
type Reason string

const (
	BadSignature        Reason = "bad-signature"
	WrongAmount         Reason = "wrong-amount"
	WrongCurrency       Reason = "wrong-currency"
	FailedBefore        Reason = "failed-before"        // its event was recorded as failed before (consumer.Permanent)
	FingerprintMismatch Reason = "fingerprint-mismatch" // its event was seen before with another payload
)

// Err is the error a dead letter's reason must match with errors.Is.
func (r Reason) Err() error {
	switch r {
	case BadSignature:
		return ErrBadSignature
	case WrongAmount:
		return ErrWrongAmount
	case WrongCurrency:
		return ErrWrongCurrency
	case FailedBefore:
		return dedup.ErrFailedBefore
	case FingerprintMismatch:
		return dedup.ErrFingerprintMismatch
	}
	return fmt.Errorf("channels: unknown reason %q", string(r))
}

// Delivery is one HTTP delivery of a callback, as the gateway publishes it:
// one line of stream.jsonl, one Kafka record.
type Delivery struct {
	Line    int       `json:"line"`    // 1-based, the order the gateway received them in
	At      time.Time `json:"at"`      // when it was received
	Order   string    `json:"order"`   // the record key: all callbacks of an order in one partition, in order
	Event   string    `json:"event"`   // the event it delivers: trade (or object) and status, as the key reads them
	Attempt int       `json:"attempt"` // the channel's attempt: 1 is the first send, then its re-sends
	Forged  string    `json:"forged,omitempty"`
	// Wrong says what is wrong with a validly signed callback (the amount,
	// the currency), which the handler refuses; empty when nothing is.
	Wrong string `json:"wrong,omitempty"`
	// What the consumer must do with it: with the channel's field
	// fingerprint, and with the whole-payload one.
	Expect      Outcome `json:"expect"`
	Reason      Reason  `json:"reason,omitempty"`
	ExpectWhole Outcome `json:"expect_whole_payload"`
	ReasonWhole Reason  `json:"reason_whole_payload,omitempty"`
	Value       string  `json:"value"` // the record's value
}

// Tally counts the outcomes of a stream.
type Tally struct {
	Deliveries  int            `json:"deliveries"`
	Events      int            `json:"events"` // distinct events committed: applied + recorded
	Applied     int            `json:"applied"`
	Recorded    int            `json:"recorded"`
	Stale       int            `json:"stale"` // not in Events: their keys are committed, nothing else
	Duplicates  int            `json:"duplicates"`
	DeadLetters map[Reason]int `json:"dead_letters"`
}

// OrderState is an order's expected end state.
type OrderState struct {
	ID          string   `json:"id"`
	Status      string   `json:"status"`
	PaidTxn     string   `json:"paid_txn,omitempty"`
	Refunded    int64    `json:"refunded,omitempty"` // partial refunds, minor units
	Transitions []string `json:"transitions"`        // "UNPAID>PAID", … in the order they happened
}

// Expected is the end state a stream must leave behind, whatever the
// delivery order across orders, once every delivery is settled.
type Expected struct {
	Channel      string           `json:"channel"`
	Fields       Tally            `json:"fields_fingerprint"`
	WholePayload Tally            `json:"whole_payload_fingerprint"`
	Orders       []OrderState     `json:"orders"`
	Balances     map[string]int64 `json:"balances"` // per account, minor units
	Sold         map[string]int64 `json:"sold"`     // per SKU: orders paid and not refunded
}

// Fixture is one channel's stream with its orders and expected end state:
// testdata/channels/<channel>/{orders.json,stream.jsonl,expected.json}.
type Fixture struct {
	Channel  string
	Orders   []Order
	Stream   []Delivery
	Expected Expected
}

// Write writes the fixture's three files into dir/<channel>.
func (f Fixture) Write(dir string) error {
	dir = filepath.Join(dir, f.Channel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files, err := f.files()
	if err != nil {
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// files renders the fixture's files.
func (f Fixture) files() (map[string][]byte, error) {
	var stream bytes.Buffer
	enc := json.NewEncoder(&stream)
	enc.SetEscapeHTML(false) // form bodies are full of &
	for _, d := range f.Stream {
		if err := enc.Encode(d); err != nil {
			return nil, err
		}
	}
	orders, err := indent(f.Orders)
	if err != nil {
		return nil, err
	}
	expected, err := indent(f.Expected)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{"orders.json": orders, "stream.jsonl": stream.Bytes(), "expected.json": expected}, nil
}

func indent(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	err := enc.Encode(v)
	return b.Bytes(), err
}

// Load reads dir/<channel>'s fixture.
func Load(dir, channel string) (Fixture, error) {
	f := Fixture{Channel: channel}
	dir = filepath.Join(dir, channel)
	read := func(name string, v any) error {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		return json.Unmarshal(b, v)
	}
	if err := read("orders.json", &f.Orders); err != nil {
		return f, err
	}
	if err := read("expected.json", &f.Expected); err != nil {
		return f, err
	}
	file, err := os.Open(filepath.Join(dir, "stream.jsonl"))
	if err != nil {
		return f, err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var d Delivery
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			return f, fmt.Errorf("%s/stream.jsonl line %d: %w", channel, len(f.Stream)+1, err)
		}
		f.Stream = append(f.Stream, d)
	}
	if err := sc.Err(); err != nil {
		return f, err
	}
	if len(f.Stream) == 0 {
		return f, errors.New("channels: " + channel + ": empty stream")
	}
	return f, nil
}
