package refunds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/effect"
)

// KeyField is the JSON field of a request that is its dedup key.
const KeyField = "refund_id"

// Request is what a message carries.
type Request struct {
	RefundID string `json:"refund_id"`
	TradeNo  string `json:"trade_no"`
	Amount   int64  `json:"amount"`
}

// Schema creates the refunds table: one row per refund request, with what
// the channel answered.
const Schema = `CREATE TABLE IF NOT EXISTS refunds (
    refund_id    TEXT PRIMARY KEY,
    trade_no     TEXT NOT NULL,
    amount       BIGINT NOT NULL,
    status       TEXT NOT NULL,   -- succeeded, refused
    answer       TEXT NOT NULL,   -- the channel's answer
    booked_at    TIMESTAMPTZ NOT NULL DEFAULT now()
)`

// Channel is an Alipay-like refund API: POST /refund with out_request_no,
// GET /refund/query?out_request_no=….
type Channel struct {
	URL  string
	HTTP *http.Client // default: 2s timeout
}

func (ch *Channel) client() *http.Client {
	if ch.HTTP != nil {
		return ch.HTTP
	}
	return &http.Client{Timeout: 2 * time.Second}
}

// Refund asks the channel to refund r under outRequestNo, with the
// journal's fencing token. A 4xx that says nothing happened is
// effect.Refused; anything else that is not a 200 leaves the outcome
// unknown.
func (ch *Channel) Refund(ctx context.Context, c effect.Call, r Request) ([]byte, error) {
	body, _ := json.Marshal(map[string]any{"out_request_no": c.ProviderKey, "trade_no": r.TradeNo, "amount": r.Amount})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ch.URL+"/refund", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Fencing-Token", strconv.FormatInt(c.Token, 10))
	resp, err := ch.client().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return answer, nil
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return nil, effect.Refused(fmt.Errorf("channel: %d", resp.StatusCode), answer)
	default: // 409 (in flight, a stale token), 5xx, a gateway's timeout: unknown
		return nil, fmt.Errorf("channel: %d %s", resp.StatusCode, answer)
	}
}

// Query asks the channel what happened to request c.ProviderKey.
func (ch *Channel) Query(ctx context.Context, c effect.Call) (effect.ReadBack, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ch.URL+"/refund/query?out_request_no="+url.QueryEscape(c.ProviderKey), nil)
	if err != nil {
		return effect.ReadBack{}, err
	}
	resp, err := ch.client().Do(req)
	if err != nil {
		return effect.ReadBack{}, err
	}
	defer resp.Body.Close()
	var out struct {
		Found  bool            `json:"found"`
		Refund json.RawMessage `json:"refund"`
	}
	if resp.StatusCode != http.StatusOK {
		return effect.ReadBack{}, fmt.Errorf("channel: query: %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return effect.ReadBack{}, fmt.Errorf("channel: query: %w", err)
	}
	if !out.Found {
		return effect.ReadBack{Status: effect.NotFound}, nil
	}
	return effect.ReadBack{Status: effect.Executed, Result: out.Refund}, nil
}

// Handler executes and books refunds.
type Handler struct {
	Journal dedup.Journal
	Channel *Channel
	// KeyTTL is how long the channel keeps an out_request_no; ReadBackLag
	// how long its query may lag. See effect.Step.
	KeyTTL, ReadBackLag time.Duration
	// Lease bounds one call; longer than Channel's timeout.
	Lease time.Duration
}

// Handle is a consumer.Handler[pgx.Tx].
func (h *Handler) Handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	var r Request
	if err := json.Unmarshal(m.Value, &r); err != nil || r.RefundID == "" || r.TradeNo == "" {
		return consumer.Permanent(fmt.Errorf("refunds: want {refund_id, trade_no, amount}: %s", m.Value))
	}
	status := "succeeded"
	answer, err := effect.Do(ctx, h.Journal, m, effect.Step{
		Name: "refund", KeyTTL: h.KeyTTL, ReadBackLag: h.ReadBackLag, Lease: h.Lease,
		Call:     func(ctx context.Context, c effect.Call) ([]byte, error) { return h.Channel.Refund(ctx, c, r) },
		ReadBack: h.Channel.Query,
	})
	var refused *effect.RefusedError
	switch {
	case errors.As(err, &refused):
		status, answer = "refused", refused.Result
	case err != nil:
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO refunds (refund_id, trade_no, amount, status, answer) VALUES ($1, $2, $3, $4, $5)`,
		r.RefundID, r.TradeNo, r.Amount, status, string(answer))
	return err
}
