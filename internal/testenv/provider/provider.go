// Package provider is a payment provider that lies, for the effect tests:
// a real HTTP server on 127.0.0.1 with an Alipay-like refund API keyed by
// out_request_no, its query API, and faults switched per request — it
// commits and then times out, commits and drops the connection, answers
// 500 after committing, answers 409 while a request with the same key is
// in flight, forgets keys after a TTL, lets its query lag its executions,
// refuses stale fencing tokens, and takes its time (Config.Latency). Its
// ledger of executions is the tests' truth: a refund executed twice is
// there twice.
//
//	POST /refund        Fencing-Token header (optional);
//	                    {"out_request_no","trade_no","amount"}
//	                    200 {"refund_id",...}: executed (now or before, while
//	                    the key is kept); 422: refused, nothing happened;
//	                    409 {"code":"IN_FLIGHT"|"STALE_TOKEN"}: not executed
//	GET  /refund/query?out_request_no=…
//	                    200 {"found":true,"refund":{…}} or {"found":false}
package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Fault is what the provider does with one refund request.
type Fault uint8

const (
	// None: it executes (once per kept key) and answers.
	None Fault = iota
	// TimeoutAfterCommit: it executes, then holds the answer until the
	// client gives up (its connection closes) or Release.
	TimeoutAfterCommit
	// DropAfterCommit: it executes, then closes the connection unanswered.
	DropAfterCommit
	// Error500AfterCommit: it executes, then answers 500.
	Error500AfterCommit
	// Error500: it answers 500 without executing.
	Error500
	// DropBefore: it closes the connection without executing.
	DropBefore
)

var faultNames = [...]string{"none", "timeout_after_commit", "drop_after_commit", "500_after_commit", "500", "drop_before"}

func (f Fault) String() string {
	if int(f) < len(faultNames) {
		return faultNames[f]
	}
	return "invalid"
}

// Committed reports whether the provider executes the request under f.
func (f Fault) Committed() bool {
	return f == None || f == TimeoutAfterCommit || f == DropAfterCommit || f == Error500AfterCommit
}

// FencingTokenHeader carries a holder's fencing token.
const FencingTokenHeader = "Fencing-Token"

// Config configures a Server. Zero values take the defaults.
type Config struct {
	// KeyTTL is how long the provider keeps an out_request_no after its
	// execution: a request with a key it forgot executes again. 0: for ever.
	KeyTTL time.Duration
	// ReadLag is how many queries of an executed request answer "not
	// found" before the query shows it (an eventually consistent query).
	ReadLag int
	// ReadLagFor is how long after an execution the query shows it.
	ReadLagFor time.Duration
	// Fault picks each refund request's fault; nil: None.
	Fault func(r Request) Fault
	// Now is the clock KeyTTL runs on; default time.Now.
	Now func() time.Time
	// Latency is the provider's processing time: every refund request and
	// every query is held that long (a timer) before the provider looks
	// at it. A client that gives up meanwhile leaves nothing executed and
	// is counted in Stats.Abandoned. 0: it answers at once.
	Latency time.Duration
}

// Request is a refund request as the provider received it.
type Request struct {
	OutRequestNo string `json:"out_request_no"`
	TradeNo      string `json:"trade_no"`
	Amount       int64  `json:"amount"`
	Token        int64  `json:"-"`
	Seq          int    `json:"-"` // its rank among all requests, from 1
}

// Execution is one refund the provider executed: a row of its ledger.
type Execution struct {
	RefundID     string    `json:"refund_id"`
	OutRequestNo string    `json:"out_request_no"`
	TradeNo      string    `json:"trade_no"`
	Amount       int64     `json:"amount"`
	Token        int64     `json:"token"`
	At           time.Time `json:"at"`
}

type key struct {
	exec    Execution
	kept    time.Time // when it was executed: kept until kept+KeyTTL
	reads   int       // queries that saw it (for ReadLag)
	fence   int64     // the largest token seen
	flights int       // requests in flight
}

// Server is the simulator. Safe for concurrent use.
type Server struct {
	cfg  Config
	addr string

	mu        sync.Mutex
	srv       *http.Server
	ledger    []Execution
	keys      map[string]*key
	fences    map[string]int64
	requests  int
	stale     int // requests refused by their token
	queries   int
	found     int // queries that showed an execution
	inFlight  int // requests refused as in flight
	abandoned int // requests whose client left during Latency
	faults    map[Fault]int
	release   chan struct{}
}

// Start starts a Server on 127.0.0.1:0; it stops when the test ends.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, keys: map[string]*key{}, fences: map[string]int64{}, faults: map[Fault]int{}, release: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("provider: %v", err)
	}
	s.addr = ln.Addr().String()
	s.serve(ln)
	t.Cleanup(func() {
		s.Release()
		s.mu.Lock()
		srv := s.srv
		s.mu.Unlock()
		srv.Close()
	})
	return s
}

func (s *Server) serve(ln net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /refund", s.refund)
	mux.HandleFunc("GET /refund/query", s.query)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	go srv.Serve(ln) //nolint:errcheck // ends with Close
}

// URL is the provider's base URL.
func (s *Server) URL() string { return "http://" + s.addr }

// Restart closes the server and every connection (requests in flight lose
// their answer, their executions stay) and listens again on the same
// address: the provider's deploy. Its ledger and keys survive.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	srv.Close()
	var ln net.Listener
	var err error
	for range 50 { // the port may linger a moment
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("provider: listen again on %s: %v", s.addr, err)
	}
	s.serve(ln)
}

// Release answers every request held by TimeoutAfterCommit (with 504).
func (s *Server) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.release:
	default:
		close(s.release)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client may be gone
}

func (s *Server) refund(w http.ResponseWriter, r *http.Request) {
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.OutRequestNo == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"code": "INVALID_PARAMETER", "msg": "want {out_request_no, trade_no, amount}"})
		return
	}
	if t := r.Header.Get(FencingTokenHeader); t != "" {
		var err error
		if req.Token, err = strconv.ParseInt(t, 10, 64); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"code": "INVALID_PARAMETER", "msg": "bad " + FencingTokenHeader})
			return
		}
	}
	if !s.hold(r.Context()) {
		return
	}
	s.mu.Lock()
	s.requests++
	req.Seq = s.requests
	now := s.cfg.Now()
	k := s.keys[req.OutRequestNo]
	if k != nil && s.cfg.KeyTTL > 0 && now.Sub(k.kept) >= s.cfg.KeyTTL && k.flights == 0 {
		delete(s.keys, req.OutRequestNo) // forgotten: a request with it executes again
		k = nil
	}
	switch {
	case req.Token > 0 && req.Token < s.fences[req.OutRequestNo]:
		s.stale++
		fence := s.fences[req.OutRequestNo]
		s.mu.Unlock()
		writeJSON(w, http.StatusConflict, map[string]string{"code": "STALE_TOKEN", "msg": fmt.Sprintf("token %d is older than %d", req.Token, fence)})
		return
	case k != nil && k.flights > 0:
		s.inFlight++
		s.mu.Unlock()
		writeJSON(w, http.StatusConflict, map[string]string{"code": "IN_FLIGHT", "msg": "a request with this out_request_no is in progress"})
		return
	case req.Amount <= 0:
		s.mu.Unlock()
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"code": "REFUND_AMT_INVALID", "msg": "the amount must be positive"})
		return
	}
	if req.Token > s.fences[req.OutRequestNo] {
		s.fences[req.OutRequestNo] = req.Token
	}
	fault := None
	if s.cfg.Fault != nil {
		fault = s.cfg.Fault(req)
	}
	s.faults[fault]++
	if !fault.Committed() {
		s.mu.Unlock()
		if fault == Error500 {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"code": "SYSTEM_ERROR"})
		} else {
			drop(w)
		}
		return
	}
	if k == nil {
		e := Execution{RefundID: fmt.Sprintf("rf-%d", len(s.ledger)+1), OutRequestNo: req.OutRequestNo, TradeNo: req.TradeNo,
			Amount: req.Amount, Token: req.Token, At: now}
		s.ledger = append(s.ledger, e)
		k = &key{exec: e, kept: now}
		s.keys[req.OutRequestNo] = k
	}
	exec := k.exec
	k.flights++
	release := s.release
	s.mu.Unlock()
	if fault == TimeoutAfterCommit {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
	s.mu.Lock()
	k.flights-- // done before the client can see anything
	s.mu.Unlock()
	switch fault {
	case TimeoutAfterCommit:
		writeJSON(w, http.StatusGatewayTimeout, map[string]string{"code": "TIMEOUT"})
	case DropAfterCommit:
		drop(w)
	case Error500AfterCommit:
		writeJSON(w, http.StatusInternalServerError, map[string]string{"code": "SYSTEM_ERROR"})
	default:
		writeJSON(w, http.StatusOK, exec)
	}
}

func drop(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		c.Close()
	}
}

// hold holds a request for Config.Latency; it reports false, the request
// abandoned, when the client gave up first.
func (s *Server) hold(ctx context.Context) bool {
	if s.cfg.Latency <= 0 {
		return true
	}
	t := time.NewTimer(s.cfg.Latency)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		s.mu.Lock()
		s.abandoned++
		s.mu.Unlock()
		return false
	}
}

func (s *Server) query(w http.ResponseWriter, r *http.Request) {
	no := r.URL.Query().Get("out_request_no")
	if !s.hold(r.Context()) {
		return
	}
	s.mu.Lock()
	var found *Execution
	for i := range s.ledger {
		if s.ledger[i].OutRequestNo == no {
			found = &s.ledger[i]
			break
		}
	}
	visible := false
	if found != nil && !s.cfg.Now().Before(found.At.Add(s.cfg.ReadLagFor)) {
		k := s.keys[no]
		if k == nil { // forgotten by the idempotency layer; the ledger still tells
			visible = true
		} else {
			k.reads++
			visible = k.reads > s.cfg.ReadLag
		}
	}
	s.queries++
	var out map[string]any
	if visible {
		s.found++
		out = map[string]any{"found": true, "refund": *found}
	} else {
		out = map[string]any{"found": false}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// Ledger returns the executions, in order.
func (s *Server) Ledger() []Execution {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Execution(nil), s.ledger...)
}

// Executions counts the executions of each out_request_no.
func (s *Server) Executions() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := map[string]int{}
	for _, e := range s.ledger {
		n[e.OutRequestNo]++
	}
	return n
}

// Stats is what the provider saw.
type Stats struct {
	Requests  int           // refund requests
	Stale     int           // refused for a stale fencing token
	InFlight  int           // refused while the key was in flight
	Queries   int           // read-backs
	Found     int           // read-backs that showed an execution
	Abandoned int           // requests and queries whose client left during Latency: not counted above
	Faults    map[Fault]int // requests by the fault they met
}

// Stats returns what the provider saw so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := make(map[Fault]int, len(s.faults))
	for k, v := range s.faults {
		f[k] = v
	}
	return Stats{Requests: s.requests, Stale: s.stale, InFlight: s.inFlight, Queries: s.queries, Found: s.found, Abandoned: s.abandoned, Faults: f}
}

// Client calls a Server, as a refund consumer would.
type Client struct {
	URL  string
	HTTP *http.Client // default: a client with a 2s timeout
}

// Refusal is a definite 4xx: the provider says nothing happened.
type Refusal struct {
	Status int
	Body   []byte
}

func (e *Refusal) Error() string { return fmt.Sprintf("provider refused (%d): %s", e.Status, e.Body) }

// ErrStaleToken: the provider refused a request whose fencing token is
// older than one it saw for the key: nothing happened for this holder.
var ErrStaleToken = errors.New("provider: stale fencing token")

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 2 * time.Second}
}

// Refund sends a refund request with token as its fencing token (0: none)
// and returns the provider's answer. A *Refusal is definite; ErrStaleToken
// and every other error leave the outcome unknown to the caller.
func (c *Client) Refund(ctx context.Context, req Request, token int64) ([]byte, error) {
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/refund", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	if token > 0 {
		hr.Header.Set(FencingTokenHeader, strconv.FormatInt(token, 10))
	}
	resp, err := c.http().Do(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := readAll(resp)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusOK:
		return b, nil
	case resp.StatusCode == http.StatusConflict && containsCode(b, "STALE_TOKEN"):
		return nil, fmt.Errorf("%w: %s", ErrStaleToken, b)
	case resp.StatusCode == http.StatusUnprocessableEntity || resp.StatusCode == http.StatusBadRequest:
		return nil, &Refusal{Status: resp.StatusCode, Body: b}
	default:
		return nil, fmt.Errorf("provider: %d %s", resp.StatusCode, b)
	}
}

// Query asks what happened to out_request_no: the execution and true, or
// false when the provider shows none (yet).
func (c *Client) Query(ctx context.Context, outRequestNo string) (Execution, bool, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/refund/query?out_request_no="+outRequestNo, nil)
	if err != nil {
		return Execution{}, false, err
	}
	resp, err := c.http().Do(hr)
	if err != nil {
		return Execution{}, false, err
	}
	defer resp.Body.Close()
	b, err := readAll(resp)
	if err != nil {
		return Execution{}, false, err
	}
	if resp.StatusCode != http.StatusOK {
		return Execution{}, false, fmt.Errorf("provider: query: %d %s", resp.StatusCode, b)
	}
	var out struct {
		Found  bool      `json:"found"`
		Refund Execution `json:"refund"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return Execution{}, false, fmt.Errorf("provider: query: %w", err)
	}
	return out.Refund, out.Found, nil
}

func readAll(resp *http.Response) ([]byte, error) {
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}

func containsCode(body []byte, code string) bool {
	var v struct {
		Code string `json:"code"`
	}
	return json.Unmarshal(body, &v) == nil && v.Code == code
}
