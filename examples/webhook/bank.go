package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemkit/idem/examples/payments"
)

// Bank is the fake bank the payouts go to: a system outside the webhook,
// reached over HTTP only, that does what a leased route needs of the
// systems it calls. It transfers once per idempotency key (a retry gets the
// transfer it made), and it fences: it remembers the largest fencing token
// it saw for a key and refuses an older one with 409, so a request whose
// lease was taken over cannot act after the one that took it.
//
//	POST /transfers   Idempotency-Key, Fencing-Token, {"account":…,"amount":…}
//	                  201 a new transfer; 200 the key's transfer again;
//	                  409 a stale token; 422 the key with another account or amount
//	GET  /transfers   every transfer, as JSON
//
// It keeps its books in a table of the webhook's database
// (fakebank_transfers), in statements of its own, never in a request's
// transaction: only so that they outlive a crash of the demo, which runs
// the bank in its own process. One bank process at a time.
type Bank struct {
	db payments.DB
	mu sync.Mutex // one transfer at a time: check, then write
}

// Transfer is one transfer the bank made.
type Transfer struct {
	ID      int64  `json:"id"`
	Key     string `json:"key"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
	Token   int64  `json:"token"` // the fencing token of the request that made it
	Fence   int64  `json:"fence"` // the largest token seen for the key since
}

// The fake bank's HTTP header fields.
const (
	// FencingTokenHeader carries a lease's token to the bank.
	FencingTokenHeader = "Fencing-Token"
)

// NewBank returns the bank on db, creating its table when missing.
func NewBank(ctx context.Context, db payments.DB) (*Bank, error) {
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS fakebank_transfers (
    idem_key VARCHAR(300) PRIMARY KEY,
    id       BIGINT NOT NULL,
    account  VARCHAR(100) NOT NULL,
    amount   BIGINT NOT NULL,
    token    BIGINT NOT NULL,
    fence    BIGINT NOT NULL
)`); err != nil {
		return nil, fmt.Errorf("bank: setup: %w", err)
	}
	return &Bank{db: db}, nil
}

// ServeHTTP serves the bank's API.
func (b *Bank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path != "/transfers":
		http.NotFound(w, r)
	case r.Method == http.MethodGet:
		list, err := b.Transfers(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, http.StatusOK, list)
	case r.Method == http.MethodPost:
		b.transfer(w, r)
	default:
		http.Error(w, "GET or POST", http.StatusMethodNotAllowed)
	}
}

func (b *Bank) transfer(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	token, err := strconv.ParseInt(r.Header.Get(FencingTokenHeader), 10, 64)
	var p payout
	if err == nil {
		err = json.NewDecoder(r.Body).Decode(&p)
	}
	if err != nil || key == "" || p.Account == "" || p.Amount <= 0 {
		http.Error(w, "want Idempotency-Key, Fencing-Token and {\"account\",\"amount\"}", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	b.mu.Lock()
	defer b.mu.Unlock()
	t, err := b.get(ctx, key)
	switch {
	case errors.Is(err, payments.ErrNoRows):
		t = Transfer{Key: key, Account: p.Account, Amount: p.Amount, Token: token, Fence: token}
		err = b.db.QueryRow(ctx, `SELECT coalesce(max(id), 0) + 1 FROM fakebank_transfers`).Scan(&t.ID)
		if err == nil {
			_, err = b.db.Exec(ctx, `INSERT INTO fakebank_transfers (idem_key, id, account, amount, token, fence) VALUES ($1, $2, $3, $4, $5, $6)`,
				t.Key, t.ID, t.Account, t.Amount, t.Token, t.Fence)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, http.StatusCreated, t)
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	case token < t.Fence:
		http.Error(w, fmt.Sprintf("stale fencing token %d: this key's requests are at %d", token, t.Fence), http.StatusConflict)
	case p.Account != t.Account || p.Amount != t.Amount:
		http.Error(w, "this key made another transfer", http.StatusUnprocessableEntity)
	default:
		if _, err := b.db.Exec(ctx, `UPDATE fakebank_transfers SET fence = $1 WHERE idem_key = $2`, token, key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		t.Fence = token
		writeJSON(w, http.StatusOK, t) // the key's transfer, not a second one
	}
}

func (b *Bank) get(ctx context.Context, key string) (Transfer, error) {
	t := Transfer{Key: key}
	err := b.db.QueryRow(ctx, `SELECT id, account, amount, token, fence FROM fakebank_transfers WHERE idem_key = $1`, key).
		Scan(&t.ID, &t.Account, &t.Amount, &t.Token, &t.Fence)
	return t, err
}

// Transfers lists the bank's transfers in the order it made them.
func (b *Bank) Transfers(ctx context.Context) ([]Transfer, error) {
	var n int64
	if err := b.db.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM fakebank_transfers`).Scan(&n); err != nil {
		return nil, err
	}
	list := []Transfer{}
	for id := int64(1); id <= n; id++ {
		var t Transfer
		err := b.db.QueryRow(ctx, `SELECT idem_key, id, account, amount, token, fence FROM fakebank_transfers WHERE id = $1`, id).
			Scan(&t.Key, &t.ID, &t.Account, &t.Amount, &t.Token, &t.Fence)
		if err != nil {
			return nil, err
		}
		list = append(list, t)
	}
	return list, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// bankClient calls the bank at url.
type bankClient struct {
	url    string
	client *http.Client
}

func newBankClient(url string) *bankClient {
	// No idle connections: a demo's calls are few, and nothing lingers.
	return &bankClient{url: url, client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
}

// errStaleToken: the bank saw a larger fencing token for the key.
var errStaleToken = errors.New("the bank refused a stale fencing token")

// transfer asks the bank for p's transfer under key and token.
func (c *bankClient) transfer(ctx context.Context, key string, token int64, p payout) (Transfer, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return Transfer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/transfers", bytes.NewReader(body))
	if err != nil {
		return Transfer{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set(FencingTokenHeader, strconv.FormatInt(token, 10))
	res, err := c.client.Do(req)
	if err != nil {
		return Transfer{}, err
	}
	defer res.Body.Close()
	msg, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return Transfer{}, err
	}
	var t Transfer
	switch res.StatusCode {
	case http.StatusOK, http.StatusCreated:
		err = json.Unmarshal(msg, &t)
		return t, err
	case http.StatusConflict:
		return t, fmt.Errorf("%w: %s", errStaleToken, bytes.TrimSpace(msg))
	default:
		return t, fmt.Errorf("bank: %s: %s", res.Status, bytes.TrimSpace(msg))
	}
}
