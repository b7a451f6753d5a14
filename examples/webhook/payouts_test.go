package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/examples/payments"
	"github.com/idemkit/idem/httpidem"
	"github.com/idemkit/idem/internal/testenv"
)

const payoutBody = `{"account":"merchant-01","amount":700}`

func payoutOf(t *testing.T, w *httptest.ResponseRecorder) payoutAnswer {
	t.Helper()
	var a payoutAnswer
	if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
		t.Fatalf("payout answer %q: %v", w.Body, err)
	}
	return a
}

// transfers is the bank's transfers of key.
func transfers(t *testing.T, b *Bank, key string) []Transfer {
	t.Helper()
	all, err := b.Transfers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []Transfer
	for _, tr := range all {
		if tr.Key == key {
			out = append(out, tr)
		}
	}
	return out
}

// oneTransfer fails the test unless the bank made exactly one transfer
// for key, and returns it.
func oneTransfer(t *testing.T, b *Bank, key string) Transfer {
	t.Helper()
	list := transfers(t, b, key)
	if len(list) != 1 {
		t.Fatalf("the bank made %d transfers for %s, want 1: %+v", len(list), key, list)
	}
	return list[0]
}

// release releases a payout's key, as an operator does
// (ReleaseRequest): the next request takes it over at once, as it would
// once the lease ran out, without the test waiting for that.
func release(t *testing.T, b backend, key string) {
	t.Helper()
	ok, err := b.store.ReleaseRequest(context.Background(), dedup.Key{Scope: httpidem.Scope(http.MethodPost, "/payouts", ""), ID: key}, 0)
	if err != nil || !ok {
		t.Fatalf("release %s: %v, %v", key, ok, err)
	}
}

// TestPayoutAnswers drives the leased route's curl lines: executed (one
// transfer, at the bank), replayed (quoted key too), a duplicate while the
// first holds the lease ("Demo-Fault: slow") 409, another body 422, no key
// or a bad one 400.
func TestPayoutAnswers(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(Options) backend) {
		g := newGate(t)
		b := open(Options{Logger: quiet, Hold: g.wait, Lease: time.Minute})
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- send(b.handler, "/payouts", "p-1", payoutBody, "slow") }()
		<-g.started
		busy := send(b.handler, "/payouts", "p-1", payoutBody, "")
		if busy.Code != http.StatusConflict || busy.Header().Get("Retry-After") == "" {
			t.Fatalf("a duplicate while the first holds the lease: %d %s, want 409 with Retry-After", busy.Code, busy.Body)
		}
		g.release()
		first := <-done
		if first.Code != http.StatusCreated || replayed(first) {
			t.Fatalf("new key: %d %s, want 201", first.Code, first.Body)
		}
		a := payoutOf(t, first)
		tr := oneTransfer(t, b.bank, "p-1")
		if a.Transfer != tr.ID || a.TakenOver || tr.Token != a.Token || tr.Amount != 700 {
			t.Fatalf("answer %+v, transfer %+v", a, tr)
		}
		for _, key := range []string{"p-1", `"p-1"`} {
			if w := send(b.handler, "/payouts", key, payoutBody, ""); w.Code != http.StatusCreated || !replayed(w) || w.Body.String() != first.Body.String() {
				t.Fatalf("Idempotency-Key: %s again: %d replayed %v %s, want the first answer replayed", key, w.Code, replayed(w), w.Body)
			}
		}
		for _, c := range []struct {
			what, key, body string
			status          int
		}{
			{"another amount", "p-1", `{"account":"merchant-01","amount":701}`, http.StatusUnprocessableEntity},
			{"no key", "", payoutBody, http.StatusBadRequest},
			{"a bad key", "p\x01", payoutBody, http.StatusBadRequest},
		} {
			if w := send(b.handler, "/payouts", c.key, c.body, ""); w.Code != c.status {
				t.Fatalf("%s: %d %s, want %d", c.what, w.Code, w.Body, c.status)
			}
		}
		oneTransfer(t, b.bank, "p-1")
	})
}

// TestPayoutFaults drives the leased route's Demo-Fault rows. After a
// 5xx or a panic the outcome is uncertain: nothing is stored, retries get
// 409 while the lease runs, and the request that takes the key over gets
// the bank's one transfer, with a larger token. After "error" the handler
// ended its lease: the retry runs at once. A request held past its lease
// ("slow") is fenced out: the bank refuses its stale token, and it is
// answered 409.
func TestPayoutFaults(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(Options) backend) {
		g := newGate(t)
		b := open(Options{Logger: quiet, Hold: g.wait, Lease: time.Minute})
		h := b.handler
		for _, c := range []struct {
			fault  string
			status int
		}{{"5xx", http.StatusBadGateway}, {"panic", http.StatusInternalServerError}} {
			key := "p-" + c.fault
			if w := send(h, "/payouts", key, payoutBody, c.fault); w.Code != c.status {
				t.Fatalf("Demo-Fault: %s: %d %s, want %d", c.fault, w.Code, w.Body, c.status)
			}
			paid := oneTransfer(t, b.bank, key)
			if w := send(h, "/payouts", key, payoutBody, ""); w.Code != http.StatusConflict || replayed(w) {
				t.Fatalf("retry after Demo-Fault: %s, the lease running: %d %s, want 409", c.fault, w.Code, w.Body)
			}
			release(t, b, key) // or wait for the lease to run out
			w := send(h, "/payouts", key, payoutBody, "")
			if w.Code != http.StatusCreated || replayed(w) {
				t.Fatalf("retry after Demo-Fault: %s, the key released: %d %s, want 201", c.fault, w.Code, w.Body)
			}
			a := payoutOf(t, w)
			tr := oneTransfer(t, b.bank, key)
			if !a.TakenOver || a.Transfer != paid.ID || a.Token <= paid.Token || tr.Fence != a.Token {
				t.Fatalf("after Demo-Fault: %s: answer %+v, transfer %+v; want the first transfer, taken over with a larger token", c.fault, a, tr)
			}
		}

		if w := send(h, "/payouts", "p-error", payoutBody, "error"); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("Demo-Fault: error: %d %s, want 503", w.Code, w.Body)
		}
		if n := len(transfers(t, b.bank, "p-error")); n != 0 {
			t.Fatalf("Demo-Fault: error made %d transfers", n)
		}
		if w := send(h, "/payouts", "p-error", payoutBody, ""); w.Code != http.StatusCreated || replayed(w) {
			t.Fatalf("retry after Demo-Fault: error: %d %s, want 201 at once (the lease was ended)", w.Code, w.Body)
		}
		oneTransfer(t, b.bank, "p-error")

		// Held past its lease: another request takes the key over and
		// pays; then the holder calls the bank with its older token.
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- send(h, "/payouts", "p-slow", payoutBody, "slow") }()
		<-g.started
		release(t, b, "p-slow")
		taker := send(h, "/payouts", "p-slow", payoutBody, "")
		if taker.Code != http.StatusCreated || !payoutOf(t, taker).TakenOver {
			t.Fatalf("taking over from a held request: %d %s, want 201, taken over", taker.Code, taker.Body)
		}
		g.release()
		if w := <-done; w.Code != http.StatusConflict {
			t.Fatalf("the request held past its lease: %d %s, want 409 (fenced out)", w.Code, w.Body)
		}
		if tr, tok := oneTransfer(t, b.bank, "p-slow"), payoutOf(t, taker).Token; tr.Token != tok || tr.Fence != tok {
			t.Fatalf("transfer %+v, want it made by the request that took over (token %d), and the held one's older token refused", tr, tok)
		}
		if w := send(h, "/payouts", "p-slow", payoutBody, ""); !replayed(w) || w.Body.String() != taker.Body.String() {
			t.Fatalf("p-slow again: %d %s, want the taker's answer replayed", w.Code, w.Body)
		}
	})
}

// TestPayoutTakeoverAfterSIGKILL runs the program as a child process on
// Postgres and sends a payout with "Demo-Fault: crash": the child pays at
// the bank and is killed (SIGKILL) before it answers, leaving the key
// Processing under its lease. Restarted, the program answers the retries
// 409 until the lease runs out; then one takes the key over with a larger
// token and gets the transfer the dead holder made: one transfer at the
// bank, and the dead holder's token is refused from then on.
func TestPayoutTakeoverAfterSIGKILL(t *testing.T) {
	pool, schema := testenv.SchemaPool(t)
	url := testenv.PostgresURL(t)
	if strings.Contains(url, "?") {
		url += "&search_path=" + schema
	} else {
		url += "?search_path=" + schema
	}
	args := []string{"-postgres", url, "-listen", "127.0.0.1:0", "-bank-listen", "127.0.0.1:0", "-lease", "2s"}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	post := func(url, key string, header map[string]string, body string) (int, http.Header, string, error) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", key)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := client.Do(req)
		if err != nil {
			return 0, nil, "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, string(b), err
	}

	first := testenv.StartChild(t, testenv.SpecEnv(t, childEnv, args))
	webhook, _ := childURLs(t, first)
	status, _, body, err := post(webhook+"/payouts", "p-crash", map[string]string{FaultHeader: "crash"}, payoutBody)
	if err == nil {
		t.Fatalf("Demo-Fault: crash answered %d %s; want the connection to die with the process", status, body)
	}
	if !first.WaitExit(time.Minute) || !first.Killed() {
		t.Fatalf("the child did not die by SIGKILL (%v):\n%s", first.Err(), first.Out)
	}

	bank := &Bank{db: payments.Pgx(pool)}
	paid := oneTransfer(t, bank, "p-crash")
	st, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var state string
	if err := pool.QueryRow(context.Background(), `SELECT state FROM `+st.Table()+` WHERE key = 'p-crash'`).Scan(&state); err != nil || state != "processing" {
		t.Fatalf("the dead holder's key: state %q, %v; want processing", state, err)
	}

	second := testenv.StartChild(t, testenv.SpecEnv(t, childEnv, args))
	webhook, bankURL := childURLs(t, second)
	var answer string
	busy := 0
	testenv.WaitUntilProgress(t, time.Minute, "a retry takes the key over", func() (bool, string) {
		status, header, body, err := post(webhook+"/payouts", "p-crash", nil, payoutBody)
		switch {
		case err != nil:
			t.Fatalf("retry: %v\n%s", err, second.Out)
		case status == http.StatusConflict && header.Get("Retry-After") != "":
			busy++
			return false, fmt.Sprintf("%d answers 409", busy)
		case status != http.StatusCreated || header.Get("Idempotent-Replayed") == "true":
			t.Fatalf("retry: %d %s, want 409 or 201", status, body)
		}
		answer = body
		return true, ""
	})
	t.Logf("%d retries answered 409 before the lease ran out", busy)
	var a payoutAnswer
	if err := json.Unmarshal([]byte(answer), &a); err != nil {
		t.Fatal(err)
	}
	tr := oneTransfer(t, bank, "p-crash")
	if !a.TakenOver || a.Transfer != paid.ID || a.Token <= paid.Token || tr.Fence != a.Token {
		t.Fatalf("the retry's answer %+v, the transfer %+v (paid by token %d); want the dead holder's transfer, taken over with a larger token",
			a, tr, paid.Token)
	}
	// The dead holder's token, late: refused by the bank.
	status, _, body, err = post(bankURL+"/transfers", "p-crash", map[string]string{FencingTokenHeader: fmt.Sprint(paid.Token)}, payoutBody)
	if err != nil || status != http.StatusConflict {
		t.Fatalf("the dead holder's token at the bank: %d %s %v, want 409", status, body, err)
	}
	status, header, body, err := post(webhook+"/payouts", "p-crash", nil, payoutBody)
	if err != nil || status != http.StatusCreated || header.Get("Idempotent-Replayed") != "true" || body != answer {
		t.Fatalf("p-crash again: %d %s %v, want the answer replayed", status, body, err)
	}
	oneTransfer(t, bank, "p-crash")
}

// childEnv carries the webhook's command line to the test binary run again
// as the webhook (runChild).
const childEnv = "IDEM_WEBHOOK_CHILD"

// runChild is the child's side: main with args as its command line.
func runChild(args *[]string) error {
	os.Args = append([]string{os.Args[0]}, *args...)
	flag.CommandLine = flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	main()
	return nil
}

// childURLs waits for a child's startup lines and returns the webhook's
// and the bank's base URLs.
func childURLs(t *testing.T, c *testenv.Child) (webhook, bank string) {
	t.Helper()
	testenv.WaitUntil(t, time.Minute, "the child serves", func() bool {
		if c.Exited() {
			t.Fatalf("the child exited:\n%s", c.Out.String())
		}
		return strings.Contains(c.Out.String(), "bank: serving http://")
	})
	for _, line := range strings.Split(c.Out.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "webhook: "):
			webhook = serving(t, line)
		case strings.HasPrefix(line, "bank: "):
			bank = serving(t, line)
		}
	}
	if webhook == "" || bank == "" {
		t.Fatalf("no addresses in the child's output:\n%s", c.Out.String())
	}
	return webhook, bank
}
