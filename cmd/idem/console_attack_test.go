package main

// Attacks on idem console and the command (issue 42), each a test that
// fails while its hole is open: what an attacker on the same host, a
// malicious page or an operator's mistake can do.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/cmd/idem/internal/redrive"
	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/dedup/pgstore"
	"github.com/idemkit/idem/internal/testenv"
)

// authOnlyConsole is a console's guard with a page behind it that only
// says "console": what the guard does before any page runs.
func authOnlyConsole(t *testing.T, log io.Writer) (*console, *httptest.Server) {
	t.Helper()
	auth, err := newConsoleAuth(testConsoleToken, "tester", "7464", false, slog.New(slog.NewTextHandler(log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c := &console{auth: auth, checkHost: true}
	srv := httptest.NewServer(c.guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "<title>console</title>console")
	}))) // on 127.0.0.1
	t.Cleanup(srv.Close)
	return c, srv
}

// TestConsoleTokenRedirectStaysOnTheConsole: the first visit with
// ?token= redirects to the same path without the token, never to another
// host. A browser removes tabs and newlines from a Location before it
// resolves it (WHATWG URL), so /<TAB>/evil.example is //evil.example: a
// path with an encoded tab (%09) must not come back with the tab in it.
// With IDEM_TEST_CHROMIUM, a real browser shows where it lands.
func TestConsoleTokenRedirectStaysOnTheConsole(t *testing.T) {
	_, srv := authOnlyConsole(t, io.Discard)
	var landed atomic.Int64
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		landed.Add(1)
		io.WriteString(w, "<title>evil</title>evil")
	}))
	defer evil.Close()
	evilHost := strings.TrimPrefix(evil.URL, "http://")
	base, _ := url.Parse(srv.URL)
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	for _, p := range []string{"/%09/" + evilHost + "/x", "/%0A/" + evilHost + "/x", "/%0D%09/" + evilHost + "/x", "/%5C%09" + evilHost} {
		// The transport, not a client: Go's client refuses to parse such a
		// Location; a browser does not.
		req, _ := http.NewRequest(http.MethodGet, srv.URL+p+"?token="+testConsoleToken, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		// What a browser does with it: tabs and newlines removed, then
		// resolved against the console's URL.
		browser := strings.NewReplacer("\t", "", "\n", "", "\r", "").Replace(loc)
		to, err := base.Parse(browser)
		if resp.StatusCode != http.StatusSeeOther || err != nil || to.Host != base.Host {
			t.Errorf("GET %s?token=…: %d, Location %q: a browser goes to %v (host %q), not the console %s", p, resp.StatusCode, loc, to, hostOf(to), base.Host)
		}
	}

	chromium := os.Getenv("IDEM_TEST_CHROMIUM")
	if chromium == "" {
		t.Log("IDEM_TEST_CHROMIUM unset: no browser run")
		return
	}
	final := browserLocation(t, chromium, srv.URL+"/%09/"+evilHost+"/x?token="+testConsoleToken)
	if u, err := url.Parse(final); err != nil || u.Host != base.Host || landed.Load() != 0 {
		t.Errorf("Chromium, sent to the console's token URL with /%%09/%s: landed on %s (the evil server saw %d requests)", evilHost, final, landed.Load())
	}
}

func hostOf(u *url.URL) string {
	if u == nil {
		return ""
	}
	return u.Host
}

// TestConsoleRateLimitHoldsAcrossLoopbackAddresses: the docs' attacker is
// another user on the same host, and every local user has all of
// 127.0.0.0/8 to send from. Wrong tokens are limited per client address,
// so each address gets its burst anew: twenty addresses, a hundred
// guesses answered at once. Loopback must count as one client (the
// operator's open session passes meanwhile, as it does now).
func TestConsoleRateLimitHoldsAcrossLoopbackAddresses(t *testing.T) {
	_, srv := authOnlyConsole(t, io.Discard)
	target := srv.URL + "/"
	guess := func(from string) int {
		tr := &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, target, nil)
		req.Header.Set("Authorization", "Bearer wrong-guess-0123456789")
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("from %s: %v", from, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	start := time.Now()
	answered, limited := 0, 0
	for i := 1; i <= 20; i++ {
		from := fmt.Sprintf("127.0.0.%d", i)
		for range authFailBurst + 1 {
			switch code := guess(from); code {
			case http.StatusUnauthorized:
				answered++
			case http.StatusTooManyRequests:
				limited++
			default:
				t.Fatalf("a wrong guess from %s: %d", from, code)
			}
		}
	}
	// The limit: the burst, and one a second after it.
	allowed := authFailBurst + int(time.Since(start)/authFailEvery) + 1
	if answered > allowed {
		t.Errorf("%d wrong tokens answered (401) from 20 loopback addresses in %v, %d refused (429): want at most %d; each address gets its own burst",
			answered, time.Since(start).Round(time.Millisecond), limited, allowed)
	}
}

// TestConsoleQuestionIsInert: a stuck request's key comes from outside
// (an HTTP client's Idempotency-Key); the confirmation's question quotes
// it, and must write it inert as the rest of the page does: no raw ESC,
// no bidi override that turns what the operator confirms around.
func TestConsoleQuestionIsInert(t *testing.T) {
	f := newConsoleFixture(t)
	ctx := testenv.Context(t, time.Minute)
	hostile := dedup.Key{Scope: "POST /payouts", ID: "po-\u202e9-\x1b[8m"}
	if _, err := f.store.AcquireLease(ctx, dedup.Claim{Key: hostile, Fingerprint: dedup.FingerprintOf([]byte("po-9"))}, time.Hour, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var lease int64
	testenv.WaitUntil(t, 30*time.Second, "the hostile lease ran out", func() bool {
		recs, err := f.store.StuckRequests(ctx, 10)
		for _, r := range recs {
			if err == nil && r.Key == hostile {
				lease = r.Token
				return true
			}
		}
		return false
	})
	body, _ := f.dryRun(t, "/release-request?scope="+url.QueryEscape(hostile.Scope)+"&key="+url.QueryEscape(hostile.ID)+"&lease="+strconvI(lease))
	for _, raw := range []string{"\u202e", "\x1b"} {
		if i := strings.Index(body, raw); i >= 0 {
			line := body[strings.LastIndexByte(body[:i], '\n')+1:]
			line, _, _ = strings.Cut(line, "\n")
			t.Errorf("the release-request dry run writes %q raw:\n%q", raw, line)
		}
	}
}

// TestConsoleAuditRefusedChoiceIsNotPartial: a redrive's confirmation
// with a choice the console does not know is refused and nothing is sent;
// the audit log (and idem_operator_actions_total) must not record it as
// done in part.
func TestConsoleAuditRefusedChoiceIsNotPartial(t *testing.T) {
	f := newConsoleFixture(t)
	ctx := testenv.Context(t, 2*time.Minute)
	if _, err := f.store.Admin().Release(ctx, []dedup.Key{{Scope: "pay", ID: "T03"}}, false); err != nil {
		t.Fatal(err)
	}
	page, tok := f.dryRun(t, "/redrive")
	if !strings.Contains(page, `name="c0"`) {
		t.Fatalf("the redrive's dry run offers no choice for its letter:\n%s", page)
	}
	end := f.end(f.topic)
	code, body := f.do(t, http.MethodPost, "/confirm", url.Values{"action": {tok}, "c0": {"send-twice"}}, nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "nothing changed") {
		t.Fatalf("a confirmation with an unknown choice: %d\n%s", code, body)
	}
	if n := f.end(f.topic) - end; n != 0 {
		t.Fatalf("a refused confirmation sent %d messages", n)
	}
	acts, err := f.store.Admin().Actions(ctx, 1)
	if err != nil || len(acts) != 1 {
		t.Fatalf("the audit log: %v %+v", err, acts)
	}
	if word, _, _ := strings.Cut(acts[0].Outcome, ":"); word != outcomeRefused {
		t.Errorf("the audit log records a refused confirmation, nothing sent, as %q, want %q", acts[0].Outcome, outcomeRefused)
	}
}

// TestConsoleSameSitePageCannotEvictConfirmation: SameSite=Strict keeps
// the session cookie from other sites, but another port of the console's
// host is the same site: a page any local user serves on 127.0.0.1:8080
// makes the operator's browser send the cookie with each of its <img>
// GETs. Each dry run it fetches keeps an action for the operator's
// session, and past 32 the operator's own confirmation is forgotten.
// The requests below are what Chromium sends for such an <img>.
func TestConsoleSameSitePageCannotEvictConfirmation(t *testing.T) {
	f := newConsoleFixture(t)
	operator := f.visit(t, "/?token="+testConsoleToken).Result().Cookies()[0]
	asOperator := func(r *http.Request) { noAuth(r); r.AddCookie(operator) }
	code, body := f.do(t, http.MethodGet, "/release?scope=pay&key=T03", nil, asOperator)
	m := actionToken.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("the operator's dry run: %d\n%s", code, body)
	}
	sameSiteImg := func(r *http.Request) {
		asOperator(r)
		r.Header.Set("Sec-Fetch-Site", "same-site")
		r.Header.Set("Sec-Fetch-Mode", "no-cors")
		r.Header.Set("Sec-Fetch-Dest", "image")
		r.Header.Set("Referer", "http://127.0.0.1:8080/")
	}
	kept := 0
	for range consolePerSession + 8 {
		if code, body := f.do(t, http.MethodGet, "/release?scope=pay&key=T03", nil, sameSiteImg); code == http.StatusOK && actionToken.MatchString(body) {
			kept++
		}
	}
	if code, body := f.confirm(t, m[1], asOperator); code != http.StatusOK || !strings.Contains(body, "released pay T03") {
		t.Errorf("the operator's confirmation after %d same-site <img> dry runs (%d kept an action): %d, want 200: %s", consolePerSession+8, kept, code, errorLine(body))
	}
}

// TestConsoleRefusesGuessableTokens: the strength check counts length and
// distinct characters, so a sequence or a keyboard walk passes it.
func TestConsoleRefusesGuessableTokens(t *testing.T) {
	for _, tok := range []string{"0123456789abcdef", "abcdefghijklmnop", "qwertyuiopasdfgh", "Password12345678"} {
		if err := checkToken(tok); err == nil {
			t.Errorf("the token %q passes the strength check", tok)
		}
	}
}

// TestBrokerCredentialsNotEchoed: an operator who writes a broker with
// credentials (user:password@host:port, as many Kafka tools take them)
// must not see the password on stderr, in the console's error or in a log
// collected from either: idem never prints a secret it was given.
func TestBrokerCredentialsNotEchoed(t *testing.T) {
	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_KAFKA_BROKERS": "ops:S3CRET-broker-pw@127.0.0.1:1"}
	code, out, errOut := idem(t, "", envs, "redrive", "--topic", "x.dlq", "--dry-run")
	if code == exitOK || strings.Contains(out+errOut, "S3CRET-broker-pw") {
		t.Errorf("idem redrive with a broker holding a password: exit %d, the password printed:\n%s%s", code, out, errOut)
	}
	_, out, errOut = idem(t, "", envs, "redrive", "--topic", "x.dlq", "--dry-run", "--json")
	if strings.Contains(out+errOut, "S3CRET-broker-pw") {
		t.Errorf("idem redrive --json with a broker holding a password prints it:\n%s%s", out, errOut)
	}
}

// browserLocation opens target in a headless Chromium and returns where
// it ends up.
func browserLocation(t *testing.T, chromium, target string) string {
	t.Helper()
	ctx := newBrowser(t, chromium)
	stepCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(stepCtx, chromedp.Navigate(target), chromedp.WaitVisible(chromedp.CSS(`body`))); err != nil {
		t.Fatalf("open %s: %v", target, err)
	}
	loc, err := chromedp.Run(stepCtx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// newBrowser starts a headless Chromium for the test.
func newBrowser(t *testing.T, chromium string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	ctx, cancel := context.WithTimeout(browser, 2*time.Minute)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chromium, err)
	}
	return ctx
}

// errorLine is a console page's error, or its start.
func errorLine(body string) string {
	if _, e, ok := strings.Cut(body, `id="error">`); ok {
		e, _, _ = strings.Cut(e, "<")
		return e
	}
	return body[:min(len(body), 200)]
}

// TestConsoleSameSitePageInTheBrowser is the attack above in Chromium:
// the operator signs in and opens a release's dry run; a page on another
// port of 127.0.0.1 shows 40 images whose addresses are the console's dry
// runs; the operator's confirmation of the release is then refused.
func TestConsoleSameSitePageInTheBrowser(t *testing.T) {
	chromium := testenv.Require(t, "IDEM_TEST_CHROMIUM", "chromium")
	f := newConsoleFixture(t)
	var withCookie atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/release" && r.Header.Get("Sec-Fetch-Dest") == "image" {
			if _, err := r.Cookie(f.console.auth.cookie); err == nil {
				withCookie.Add(1)
			}
		}
		f.h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	const imgs = consolePerSession + 8
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<title>cat pictures</title>")
		for i := range imgs {
			fmt.Fprintf(w, `<img src="%s/release?scope=pay&key=T03&n=%d">`, srv.URL, i)
		}
	}))
	defer evil.Close()
	ctx := newBrowser(t, chromium)
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		stepCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(stepCtx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	do("sign in", chromedp.Navigate(srv.URL+"/?token="+testConsoleToken), chromedp.WaitVisible(chromedp.CSS(`body`)))
	do("the release's dry run", chromedp.Navigate(srv.URL+"/release?scope=pay&key=T03"), chromedp.WaitVisible(chromedp.CSS(`#confirm`)))
	tok, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('input[name=action]').value`))
	if err != nil || tok == "" {
		t.Fatalf("the dry run's token: %q %v", tok, err)
	}
	do("the other page", chromedp.Navigate(evil.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`body`)))
	testenv.WaitUntil(t, 30*time.Second, "the page's images fetched", func() bool { return withCookie.Load() >= imgs })
	// The operator comes back to the console and confirms the dry run
	// seen before (its page, kept open in another tab).
	do("back on the console", chromedp.Navigate(srv.URL+"/failed"), chromedp.WaitVisible(chromedp.CSS(`body`)))
	submit := fmt.Sprintf(`(() => { const f = document.createElement('form'); f.method = 'post'; f.action = '/confirm';
		const i = document.createElement('input'); i.type = 'hidden'; i.name = 'action'; i.value = %q;
		f.appendChild(i); document.body.appendChild(f); f.submit(); return true })()`, tok)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](submit)); err != nil {
		t.Fatal(err)
	}
	do("the confirmation's page", chromedp.WaitVisible(chromedp.CSS(`h1`)))
	text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`main`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "released pay T03") {
		t.Errorf("Chromium sent the session cookie with %d same-site <img> dry runs from %s; then the operator's confirmation: %q", withCookie.Load(), evil.URL, strings.TrimSpace(text))
	}
}

// TestRedriveIsRecordedWhateverTheLetterHolds: a dead letter's headers
// come from outside. A NUL in its idem-cause goes into the plan's JSON as
// \u0000, which Postgres's jsonb refuses: the redrive sends the letter
// back, then fails to record that it did. An action must not run without
// its record (record first, or record what Postgres can hold).
func TestRedriveIsRecordedWhateverTheLetterHolds(t *testing.T) {
	p := newPayments(t)
	ctx := testenv.Context(t, 2*time.Minute)
	if code, _, _ := idem(t, "", p.envs, "migrate"); code != exitOK {
		t.Fatalf("migrate: exit %d", code)
	}
	w := &kafkago.Writer{Addr: kafkago.TCP(p.brokers...), Topic: p.dlq, RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, Transport: p.tr}
	defer w.Close()
	h := func(k, v string) kafkago.Header { return kafkago.Header{Key: k, Value: []byte(v)} }
	if err := w.WriteMessages(ctx, kafkago.Message{Key: []byte("N1"), Value: []byte(`{"txn_id":"N1","amount":1}`), Headers: []kafkago.Header{
		h(wire.MetaTopic, p.topic), h(wire.MetaPartition, "0"), h(wire.MetaKeyScope, "pay"), h(wire.MetaKey, "N1"),
		h(wire.MetaCause, "permanent\x00"), h(wire.MetaReason, "boom"),
	}}); err != nil {
		t.Fatal(err)
	}
	before := p.end(p.topic)
	code, _, errOut := idem(t, "", p.envs, "redrive", "--topic", p.dlq)
	sent := p.end(p.topic) - before
	acts, err := testStore(t, p).Admin().Actions(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if sent > 0 && len(acts) == 0 {
		t.Errorf("idem redrive sent %d letter(s) and the audit log holds no record of it (exit %d): %s", sent, code, strings.TrimSpace(errOut))
	}
}

func testStore(t *testing.T, p *payments) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(p.pool, pgstore.Config{Schema: p.schema})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestConsoleTokenFileReadableByOthers: --token-file is the way the docs
// give to keep the token from other local users; a file they can read
// (mode 0644, what a plain echo > file makes) gives it to them all the
// same. The console should say so, as ssh does of a key file. Its
// trailing newline (CRLF too) is not part of the token: that part holds.
func TestConsoleTokenFileReadableByOthers(t *testing.T) {
	_, schema := testenv.SchemaPool(t)
	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema}
	if code, _, _ := idem(t, "", envs, "migrate"); code != exitOK {
		t.Fatal("migrate")
	}
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(testConsoleToken+"\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errOut := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"console", "--addr", "127.0.0.1:0", "--token-file", file}, &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: errOut,
			getenv: func(k string) string { return envs[k] }})
	}()
	testenv.WaitUntil(t, 30*time.Second, "the console's address", func() bool { return strings.Contains(errOut.String(), "idem console: http://") })
	line := strings.TrimSpace(errOut.String())
	line = line[strings.Index(line, "http://"):]
	addr, _, _ := strings.Cut(line, " ")
	req, _ := http.NewRequest(http.MethodGet, strings.TrimSuffix(addr, "/")+"/audit", nil)
	req.Header.Set("Authorization", "Bearer "+testConsoleToken)
	tr := &http.Transport{DisableKeepAlives: true}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tr.CloseIdleConnections()
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("console: exit %d", code)
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the token from a file ending in CRLF: %d, want 200", resp.StatusCode)
	}
	if out := errOut.String(); !strings.Contains(out, file) || !strings.Contains(out, "readable") {
		t.Errorf("--token-file %s, mode 0644: the console says nothing of other users reading it:\n%s", file, out)
	}
}

// TestStalePlanRefusalIsInert: a letter's key comes from its headers;
// a stale plan's refusal quotes it ("shown send of key pay/…"), and
// idem redrive --plan prints that refusal as it is: an OSC sequence in
// the key retitles the operator's terminal. The console shows the same
// refusal in its error box.
func TestStalePlanRefusalIsInert(t *testing.T) {
	p := newPayments(t)
	ctx := testenv.Context(t, 2*time.Minute)
	if code, _, _ := idem(t, "", p.envs, "migrate"); code != exitOK {
		t.Fatalf("migrate: exit %d", code)
	}
	hostile := "N1\x1b]0;pwned\x07\u202e"
	w := &kafkago.Writer{Addr: kafkago.TCP(p.brokers...), Topic: p.dlq, RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, Transport: p.tr}
	defer w.Close()
	h := func(k, v string) kafkago.Header { return kafkago.Header{Key: k, Value: []byte(v)} }
	if err := w.WriteMessages(ctx, kafkago.Message{Key: []byte("N1"), Value: []byte(`{"txn_id":"N1","amount":1}`), Headers: []kafkago.Header{
		h(wire.MetaTopic, p.topic), h(wire.MetaPartition, "0"), h(wire.MetaKeyScope, "pay"), h(wire.MetaKey, hostile),
		h(wire.MetaCause, "permanent"), h(wire.MetaReason, "boom"),
	}}); err != nil {
		t.Fatal(err)
	}
	code, plan, _ := idem(t, "", p.envs, "redrive", "--topic", p.dlq, "--dry-run", "--json")
	if code != exitOK {
		t.Fatalf("the dry run: exit %d", code)
	}
	file := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(file, []byte(plan), 0o600); err != nil {
		t.Fatal(err)
	}
	// The console's dry run of the same plan, before it goes stale.
	store := testStore(t, p)
	c := &console{admin: store.Admin(), reqs: store, checkHost: true, broker: redrive.Kafka{Brokers: p.brokers, Timeout: 10 * time.Second},
		topic: p.dlq, group: redrive.DefaultGroup, max: 1000, maxRedrives: redrive.DefaultMaxRedrives, margin: 2}
	f := &consoleFixture{payments: p, store: store, console: c}
	var err error
	if c.auth, err = newConsoleAuth(testConsoleToken, "tester", "7464", false, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	f.h = c.handler()
	_, tok := f.dryRun(t, "/redrive")
	// The key fails meanwhile: the plan (send) is stale.
	if err := store.RecordFailure(ctx, dedup.Claim{Key: dedup.Key{Scope: "pay", ID: hostile}, Fingerprint: dedup.FingerprintOf([]byte("N1"))}, "boom"); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := idem(t, "", p.envs, "redrive", "--plan", file)
	if code != exitNotConfirmed || !strings.Contains(errOut, "stale plan") {
		t.Fatalf("idem redrive --plan of a stale plan: exit %d\n%q", code, errOut)
	}
	if strings.ContainsAny(errOut, "\x1b\x07\u202e") {
		t.Errorf("idem redrive --plan prints the stale plan's key raw: %q", errOut)
	}
	code, body := f.do(t, http.MethodPost, "/confirm", url.Values{"action": {tok}}, nil)
	if code != http.StatusConflict {
		t.Fatalf("the console's confirmation of a stale plan: %d %s", code, errorLine(body))
	}
	if e := errorLine(body); strings.ContainsAny(e, "\x1b\x07\u202e") {
		t.Errorf("the console shows the stale plan's key raw: %q", e)
	}
	// Both refusals are recorded as such, with their reason.
	acts, err := store.Admin().Actions(ctx, 2)
	if err != nil || len(acts) != 2 {
		t.Fatalf("the audit log: %v %+v", err, acts)
	}
	for _, a := range acts {
		if !strings.HasPrefix(a.Outcome, outcomeRefused+": stale plan: ") {
			t.Errorf("the audit log records %s's refusal of a stale plan as %q, want %q", a.Actor, a.Outcome, outcomeRefused+": stale plan: …")
		}
	}
}
