package httpidem_test

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/pgtest"
)

// TestRouteEntityAlipayCallbackKeyedByBody (seam 40.64): the Alipay route
// of docs/order.md ("HTTP routes: Route.Entity"), as the page builds it, on
// real Postgres, receiving an Alipay asynchronous notification as Alipay
// sends it: a form body and no Idempotency-Key header (its identity is in
// the body). Route.Key takes the key from the body (trade_no,
// trade_status, a refund's out_biz_no), so the notice is applied once; its
// re-send, with a new notify_time and sign, is the same request under that
// key (the fingerprint leaves them out) and gets the stored "success"
// without running the handler again.
func TestRouteEntityAlipayCallbackKeyedByBody(t *testing.T) {
	pool := testenv.Pool(t)
	store := pgtest.Store(t, pool, testenv.Schema(t, pool))
	trade := tradeStatus
	m, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	apply := httpidem.TxHandlerFunc[pgx.Tx](func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		ran++
		_, err := io.WriteString(w, "success")
		return err
	})
	mux := http.NewServeMux()
	mux.Handle("POST /callbacks/alipay", m.Transactional(httpidem.Route{
		// Alipay sends no key header: the notice's identity is in its body.
		Key: func(r *http.Request, body []byte) (string, error) {
			v, err := url.ParseQuery(string(body))
			if err != nil {
				return "", err
			}
			key := v.Get("trade_no") + "/" + v.Get("trade_status")
			if refund := v.Get("out_biz_no"); refund != "" {
				key += "/" + refund // a partial refund is TRADE_SUCCESS again
			}
			return key, nil
		},
		// A re-send has a new notify_time and sign: leave them out.
		Fingerprint: httpidem.FormFields("out_trade_no", "trade_no", "trade_status", "total_amount", "refund_fee"),
		Entity: func(r *http.Request, body []byte) (httpidem.Entity, error) {
			v, err := url.ParseQuery(string(body))
			if err != nil {
				return httpidem.Entity{}, err
			}
			at, err := time.Parse(time.DateTime, cmp.Or(v.Get("gmt_close"), v.Get("gmt_refund"), v.Get("gmt_payment")))
			if err != nil {
				return httpidem.Entity{}, err
			}
			ver, err := trade.At(at.Unix(), v.Get("trade_status"))
			return httpidem.Entity{Name: v.Get("trade_no"), Version: ver}, err
		},
		Stale: func(w http.ResponseWriter, r *http.Request, s httpidem.StaleRequest) {
			fmt.Fprint(w, "success")
		},
	}, apply))

	form := url.Values{
		"notify_time": {"2026-12-07 10:04:06"}, "notify_type": {"trade_status_sync"},
		"notify_id": {"ac05099524730693a8b330c5ecf72da9"}, "sign_type": {"RSA2"}, "sign": {"c2lnbg=="},
		"trade_no": {"2026120722001400000000000001"}, "out_trade_no": {"O1"}, "trade_status": {"TRADE_SUCCESS"},
		"total_amount": {"88.00"}, "gmt_payment": {"2026-12-07 10:04:05"},
	}
	post := func(what string) {
		t.Helper()
		r := httptest.NewRequest(http.MethodPost, "/callbacks/alipay", strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		if w.Code != http.StatusOK || w.Body.String() != "success" || ran != 1 {
			t.Errorf("Alipay's %s to the documented route: %d %q, handler ran %d times; want 200 \"success\", applied once",
				what, w.Code, strings.TrimSpace(w.Body.String()), ran)
		}
	}
	post("notification")
	form.Set("notify_time", "2026-12-07 10:08:06")
	form.Set("sign", "cmVzZW50")
	post("re-send (new notify_time and sign)")
}

// TestRouteEntityFailedHandlerMovesNoWatermark (seam 40.65, holds):
// the handler of a newer callback fails (500) after the entity step moved
// the watermark in its transaction: the rollback takes the watermark back
// with it, so an older callback that comes next is applied, not stale,
// and the newer one's retry under its key runs again and applies.
func TestRouteEntityFailedHandlerMovesNoWatermark(t *testing.T) {
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	store := pgtest.Store(t, pool, schema)
	ctx := testenv.Context(t, time.Minute)
	applied := pgx.Identifier{schema, "applied"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+applied+` (seq BIGSERIAL PRIMARY KEY, status TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	m, err := httpidem.New(httpidem.Config[pgx.Tx]{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	fail := true
	srv := m.Transactional(httpidem.Route{
		Name: "/callbacks/alipay",
		Entity: func(_ *http.Request, body []byte) (httpidem.Entity, error) {
			var c callback
			if err := json.Unmarshal(body, &c); err != nil {
				return httpidem.Entity{}, err
			}
			v, err := tradeStatus.At(c.At, c.Status)
			return httpidem.Entity{Name: c.Trade, Version: v}, err
		},
	}, httpidem.TxHandlerFunc[pgx.Tx](func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		var c callback
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			return err
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+applied+` (status) VALUES ($1)`, c.Status); err != nil {
			return err
		}
		if fail && c.Status == "TRADE_CLOSED" {
			return errors.New("the ledger refused the refund")
		}
		_, err := io.WriteString(w, "success")
		return err
	}))
	if w := postCallback(srv, "n2", callback{"T1", "TRADE_CLOSED", 200}); w.Code < 500 {
		t.Fatalf("failing close: %d %q, want a 5xx", w.Code, w.Body)
	}
	if w := postCallback(srv, "n1", callback{"T1", "TRADE_SUCCESS", 100}); w.Code != 200 || w.Header().Get(httpidem.HeaderStale) != "" {
		t.Fatalf("payment after a failed close: %d %v %q, want applied (the close moved nothing)", w.Code, w.Header(), w.Body)
	}
	fail = false
	if w := postCallback(srv, "n2", callback{"T1", "TRADE_CLOSED", 200}); w.Code != 200 || w.Header().Get(httpidem.HeaderStale) != "" {
		t.Fatalf("close retried: %d %v %q, want applied", w.Code, w.Header(), w.Body)
	}
	var got []string
	rows, err := pool.Query(ctx, `SELECT status FROM `+applied+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[TRADE_SUCCESS TRADE_CLOSED]" {
		t.Errorf("applied %v, want [TRADE_SUCCESS TRADE_CLOSED]: the failed close committed nothing", got)
	}
}
