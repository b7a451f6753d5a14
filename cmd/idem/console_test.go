package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/redrive"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// consoleFixture is a console over payments (newPayments): T03's account
// is blocked, so T03 is a failed key with a dead letter; and a leased HTTP
// request whose lease ran out, stuck.
type consoleFixture struct {
	*payments
	store   *pgstore.Store
	console *console
	h       http.Handler
	stuck   dedup.Key
	authLog *syncBuffer // the console's log of wrong tokens
}

// testConsoleToken is the fixture console's token; do sends it.
const testConsoleToken = "test-console-token-0123456789abcdef"

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newConsoleFixture(t *testing.T) *consoleFixture {
	p := newPayments(t)
	ctx := testenv.Context(t, 2*time.Minute)
	if _, err := p.pool.Exec(ctx, `INSERT INTO blocked VALUES ('T03')`); err != nil {
		t.Fatal(err)
	}
	p.produce("T00", "T01", "T02", "T03", "T04")
	p.start()
	p.waitFor("5 settled", func(s consumer.Stats) bool { return s.Applied+s.DeadLettered == 5 })
	store, err := pgstore.New(p.pool, pgstore.Config{Schema: p.schema})
	if err != nil {
		t.Fatal(err)
	}
	f := &consoleFixture{payments: p, store: store, stuck: dedup.Key{Scope: "POST /payouts", ID: "po-1"}}
	if _, err := store.AcquireLease(ctx, dedup.Claim{Key: f.stuck, Fingerprint: dedup.FingerprintOf([]byte("po-1"))}, time.Hour, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	testenv.WaitUntil(t, 30*time.Second, "the lease ran out", func() bool {
		recs, err := store.StuckRequests(ctx, 10)
		return err == nil && len(recs) == 1
	})
	f.console = &console{admin: store.Admin(), reqs: store, journal: store, checkHost: true,
		broker: redrive.Kafka{Brokers: p.brokers, Timeout: 10 * time.Second}, topic: p.dlq, group: redrive.DefaultGroup,
		max: 1000, maxRedrives: redrive.DefaultMaxRedrives, margin: 2}
	f.authLog = &syncBuffer{}
	auth, err := newConsoleAuth(testConsoleToken, "tester", "7464", false, slog.New(slog.NewTextHandler(f.authLog, nil)))
	if err != nil {
		t.Fatal(err)
	}
	f.console.auth = auth
	f.h = f.console.handler()
	return f
}

// do sends a request to the console as a browser on its own page would
// (Host 127.0.0.1:7464, Sec-Fetch-Site same-origin) with the token as a
// bearer token, changed by edit.
func (f *consoleFixture) do(t *testing.T, method, target string, form url.Values, edit func(*http.Request)) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	r := httptest.NewRequest(method, target, body)
	r.Host = "127.0.0.1:7464"
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	r.Header.Set("Authorization", "Bearer "+testConsoleToken)
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if edit != nil {
		edit(r)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

var actionToken = regexp.MustCompile(`name="action" value="([0-9a-f]+)"`)

// dryRun GETs an action's dry run and returns its page and token.
func (f *consoleFixture) dryRun(t *testing.T, target string) (string, string) {
	t.Helper()
	code, body := f.do(t, http.MethodGet, target, nil, nil)
	m := actionToken.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("GET %s: %d, no confirmation:\n%s", target, code, body)
	}
	return body, m[1]
}

func (f *consoleFixture) confirm(t *testing.T, token string, edit func(*http.Request)) (int, string) {
	t.Helper()
	return f.do(t, http.MethodPost, "/confirm", url.Values{"action": {token}}, edit)
}

// table is the dedup table's contents, every column.
func (f *consoleFixture) table(t *testing.T) string {
	t.Helper()
	var s string
	if err := f.pool.QueryRow(context.Background(), `SELECT coalesce(json_agg(d ORDER BY scope, key)::text, '') FROM idem_dedup d`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConsoleGetNeverWrites: every page, the dry runs of every action
// included, leaves the dedup table, the topics and the redrive group's
// offsets as they were, and shows what the command's dry runs show.
func TestConsoleGetNeverWrites(t *testing.T) {
	f := newConsoleFixture(t)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, duplicateAges) }))
	defer metrics.Close()
	f.console.metrics = metrics.URL
	before, topicEnd := f.table(t), f.end(f.topic)
	lease := f.stuckToken(t)
	pages := map[string]string{
		"/":                                  "failed",
		"/failed":                            "account blocked",
		"/release?scope=pay&key=T03&key=T01": "would release pay T03",
		"/stuck":                             "po-1",
		"/release-request?scope=" + url.QueryEscape(f.stuck.Scope) + "&key=po-1&lease=" + lease: "would release request POST /payouts po-1",
		"/letters": "permanent",
		"/redrive": "refused",
	}
	for range 2 {
		for target, want := range pages {
			code, body := f.do(t, http.MethodGet, target, nil, nil)
			if code != http.StatusOK || !strings.Contains(body, want) {
				t.Errorf("GET %s: %d, want %q in\n%s", target, code, want, body)
			}
		}
	}
	if code, _ := f.do(t, http.MethodGet, "/confirm?action=x", nil, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /confirm: %d", code)
	}
	// The dry run prints what idem release --dry-run prints.
	_, out, _ := idem(t, "", f.envs, "release", "--scope", "pay", "--dry-run", "T03")
	if _, body := f.do(t, http.MethodGet, "/release?scope=pay&key=T03", nil, nil); !strings.Contains(body, strings.TrimSpace(out)) {
		t.Errorf("the console's dry run differs from idem release --dry-run's %q:\n%s", out, body)
	}
	if after := f.table(t); after != before {
		t.Errorf("a GET changed the dedup table:\nbefore %s\nafter  %s", before, after)
	}
	if end := f.end(f.topic); end != topicEnd {
		t.Errorf("a GET sent %d messages", end-topicEnd)
	}
	// The redrive group did not move: a redrive still finds the letter.
	code, out, _ := idem(t, "", f.envs, "redrive", "--topic", f.dlq, "--dry-run", "--json")
	if rd := decode[redriveJSON](t, out); code != exitPartial || len(rd.Letters) != 1 || rd.Letters[0].Cause != consumer.CausePermanent.String() {
		t.Errorf("after the GETs, redrive --dry-run: %d %+v", code, rd)
	}
}

func (f *consoleFixture) stuckToken(t *testing.T) string {
	t.Helper()
	recs, err := f.store.StuckRequests(context.Background(), 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("stuck requests: %v %+v", err, recs)
	}
	return strconvI(recs[0].Token)
}

func strconvI(n int64) string { return strconv.FormatInt(n, 10) }

// TestConsoleConfirmation: an action runs only on a POST carrying the
// one-time token of its dry run, once; a stuck request's release is bound
// to the lease token shown, so a request that moved on is not released;
// a redrive through the console sends the released key's letter back.
func TestConsoleConfirmation(t *testing.T) {
	f := newConsoleFixture(t)
	ctx := context.Background()
	before := f.table(t)
	for _, form := range []url.Values{{}, {"action": {""}}, {"action": {"0123456789abcdef0123456789abcdef0123456789abcdef"}}} {
		if code, body := f.do(t, http.MethodPost, "/confirm", form, nil); code != http.StatusForbidden || !strings.Contains(body, "nothing changed") {
			t.Errorf("POST /confirm %v: %d\n%s", form, code, body)
		}
	}
	if after := f.table(t); after != before {
		t.Errorf("a refused POST changed the table")
	}

	// Release T03: the dry run's token, once.
	_, tok := f.dryRun(t, "/release?scope=pay&key=T03")
	if code, body := f.confirm(t, tok, nil); code != http.StatusOK || !strings.Contains(body, "released pay T03") {
		t.Fatalf("confirm the release: %d\n%s", code, body)
	}
	if rows, err := f.store.Admin().Find(ctx, "pay", "T03"); err != nil || len(rows) != 0 {
		t.Fatalf("T03 not released: %v %+v", err, rows)
	}
	if code, _ := f.confirm(t, tok, nil); code != http.StatusForbidden {
		t.Errorf("the release's token used twice: %d", code)
	}

	// A stuck request moves on (taken over) between the dry run and the
	// confirmation: not released. Then released from a fresh dry run.
	lease := f.stuckToken(t)
	_, tok = f.dryRun(t, "/release-request?scope="+url.QueryEscape(f.stuck.Scope)+"&key=po-1&lease="+lease)
	rec, err := f.store.AcquireLease(ctx, dedup.Claim{Key: f.stuck, Fingerprint: dedup.FingerprintOf([]byte("po-1"))}, time.Hour, 50*time.Millisecond)
	if err != nil || !rec.Takeover {
		t.Fatalf("take over: %v %+v", err, rec)
	}
	if code, body := f.confirm(t, tok, nil); code != http.StatusConflict || !strings.Contains(body, "moved on") {
		t.Errorf("release of a request that moved on: %d\n%s", code, body)
	}
	testenv.WaitUntil(t, 30*time.Second, "the new lease ran out", func() bool {
		recs, err := f.store.StuckRequests(ctx, 10)
		return err == nil && len(recs) == 1 && recs[0].Token == rec.Token
	})
	if got := f.stuckToken(t); got != strconvI(rec.Token) {
		t.Fatalf("the refused release changed the token: %s, want %d", got, rec.Token)
	}
	_, tok = f.dryRun(t, "/release-request?scope="+url.QueryEscape(f.stuck.Scope)+"&key=po-1&lease="+strconvI(rec.Token))
	if code, body := f.confirm(t, tok, nil); code != http.StatusOK || !strings.Contains(body, "released request") {
		t.Fatalf("release of the stuck request: %d\n%s", code, body)
	}
	// Released, the key stays processing without a lease until a request
	// takes it over, with a token that fences the holder out.
	if recs, err := f.store.StuckRequests(ctx, 10); err != nil || len(recs) != 1 || recs[0].Token <= rec.Token {
		t.Errorf("after its release, the token did not grow: %v %+v", err, recs)
	}
	// The released key is taken over with a larger token.
	if next, err := f.store.AcquireLease(ctx, dedup.Claim{Key: f.stuck, Fingerprint: dedup.FingerprintOf([]byte("po-1"))}, time.Hour, time.Minute); err != nil ||
		next.Verdict != dedup.VerdictRun || next.Token <= rec.Token {
		t.Errorf("after the release: %v %+v", err, next)
	}

	// Redrive: T03's letter goes back (its key was released), once.
	if _, err := f.pool.Exec(ctx, `DELETE FROM blocked`); err != nil {
		t.Fatal(err)
	}
	body, tok := f.dryRun(t, "/redrive")
	if !strings.Contains(body, "would_send") {
		t.Errorf("redrive dry run:\n%s", body)
	}
	if code, body := f.confirm(t, tok, nil); code != http.StatusOK || !strings.Contains(body, "1 sent") {
		t.Fatalf("confirm the redrive: %d\n%s", code, body)
	}
	if code, _ := f.confirm(t, tok, nil); code != http.StatusForbidden {
		t.Errorf("the redrive's token used twice: %d", code)
	}
	f.waitFor("the redriven letter applied", func(s consumer.Stats) bool { return s.Applied == 5 })
	if got := f.ledger(); got["T03"] != 1 {
		t.Errorf("ledger %v", got)
	}
}

// TestConsoleCrossOriginHostAndToken: a POST from another origin is
// refused and leaves its token usable; a Host that is not a loopback name
// is refused (DNS rebinding); off loopback, the console does not start
// without a token (console_auth_test.go has the rest of the token's).
func TestConsoleCrossOriginHostAndToken(t *testing.T) {
	f := newConsoleFixture(t)
	_, tok := f.dryRun(t, "/release?scope=pay&key=T03")
	for name, edit := range map[string]func(*http.Request){
		"Sec-Fetch-Site: cross-site": func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") },
		"Origin of another host": func(r *http.Request) {
			r.Header.Del("Sec-Fetch-Site")
			r.Header.Set("Origin", "http://evil.example")
		},
	} {
		if code, _ := f.confirm(t, tok, edit); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, code)
		}
	}
	if rows, _ := f.store.Admin().Find(context.Background(), "pay", "T03"); len(rows) != 1 {
		t.Fatal("a cross-origin POST released T03")
	}
	for host, want := range map[string]int{
		"evil.example": http.StatusMisdirectedRequest, "evil.example:7464": http.StatusMisdirectedRequest, "127.0.0.1.nip.io": http.StatusMisdirectedRequest,
		"localhost:7464": http.StatusOK, "[::1]:7464": http.StatusOK, "127.0.0.1": http.StatusOK,
	} {
		if code, _ := f.do(t, http.MethodGet, "/failed", nil, func(r *http.Request) { r.Host = host }); code != want {
			t.Errorf("GET with Host %s: %d, want %d", host, code, want)
		}
		if want != http.StatusOK {
			if code, _ := f.confirm(t, tok, func(r *http.Request) { r.Host = host }); code != want {
				t.Errorf("POST with Host %s: %d, want %d", host, code, want)
			}
		}
	}
	// Refused requests did not use the token up.
	if code, _ := f.confirm(t, tok, nil); code != http.StatusOK {
		t.Errorf("the token after refused requests: %d", code)
	}

	if code, _, errOut := idem(t, "", f.envs, "console", "--addr", "0.0.0.0:0"); code != exitUsage || !strings.Contains(errOut, "--token") {
		t.Errorf("console off loopback without a token: %d %q", code, errOut)
	}
}

// takeOverFirst is the store as the console's release of a stuck request
// meets it when a request takes the key over just before the release lands.
type takeOverFirst struct {
	*pgstore.Store
	took dedup.RequestRecord
	err  error
}

func (s *takeOverFirst) ReleaseRequest(ctx context.Context, k dedup.Key, token int64) (bool, error) {
	s.took, s.err = s.Store.AcquireLease(ctx, dedup.Claim{Key: k, Fingerprint: dedup.FingerprintOf([]byte(k.ID))}, time.Hour, time.Minute)
	return s.Store.ReleaseRequest(ctx, k, token)
}

// TestConsoleReleaseSparesATakeover: a request takes the stuck key over
// while the console's release runs. The release is refused ("moved on")
// and the request that took over is not fenced out: it finishes. (The
// release used to end the lease shown and then release the key whatever
// its token, which fenced the new holder out of a run it had just begun,
// and the next retry would run the handler again.)
func TestConsoleReleaseSparesATakeover(t *testing.T) {
	f := newConsoleFixture(t)
	ctx := testenv.Context(t, time.Minute)
	w := &takeOverFirst{Store: f.store}
	f.console.reqs = w
	_, tok := f.dryRun(t, "/release-request?scope="+url.QueryEscape(f.stuck.Scope)+"&key=po-1&lease="+f.stuckToken(t))
	code, body := f.confirm(t, tok, nil)
	if w.err != nil || !w.took.TakenOver() {
		t.Fatalf("take over: %v %+v", w.err, w.took)
	}
	if code != http.StatusConflict || !strings.Contains(body, "moved on") {
		t.Errorf("release while a request took the key over: %d\n%s", code, body)
	}
	if err := f.store.FinishLease(ctx, f.stuck, w.took.Token, dedup.StoredResponse{Status: http.StatusCreated}); err != nil {
		t.Errorf("the new holder's finish: %v, want nil: the release fenced it out", err)
	}
}
