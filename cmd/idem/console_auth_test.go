package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
)

func noAuth(r *http.Request) { r.Header.Del("Authorization") }

// visit is a GET without the bearer token, with the cookies given.
func (f *consoleFixture) visit(t *testing.T, target string, cookies ...*http.Cookie) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, target, nil)
	r.Host = "127.0.0.1:7464"
	for _, c := range cookies {
		r.AddCookie(c)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

// TestConsoleRequiresToken: on loopback too, a request without the token
// is refused, a GET and a POST alike; the first visit with ?token= sets a
// session cookie that is not the token and sends the browser on without
// the token in the address; a bearer token works; the redirect never
// leaves the console (//evil.example).
func TestConsoleRequiresToken(t *testing.T) {
	f := newConsoleFixture(t)
	before := f.table(t)
	if !f.console.checkHost {
		t.Fatal("the fixture is not on loopback")
	}
	for _, target := range []string{"/", "/failed", "/release?scope=pay&key=T03", "/letters"} {
		if code, _ := f.do(t, http.MethodGet, target, nil, noAuth); code != http.StatusUnauthorized {
			t.Errorf("GET %s without the token, on loopback: %d, want 401", target, code)
		}
	}
	_, tok := f.dryRun(t, "/release?scope=pay&key=T03")
	if code, _ := f.confirm(t, tok, noAuth); code != http.StatusUnauthorized {
		t.Errorf("POST /confirm without the token: %d, want 401", code)
	}
	if code, _ := f.do(t, http.MethodGet, "/", nil, func(r *http.Request) { r.Header.Set("Authorization", "Bearer wrong") }); code != http.StatusUnauthorized {
		t.Errorf("a wrong bearer token: %d", code)
	}
	if after := f.table(t); after != before {
		t.Error("an unauthenticated request changed the table")
	}

	w := f.visit(t, "/failed?scope=pay&token="+testConsoleToken)
	cookies := w.Result().Cookies()
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/failed?scope=pay" || len(cookies) != 1 {
		t.Fatalf("?token=: %d %v %+v", w.Code, w.Header(), cookies)
	}
	ck := cookies[0]
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || strings.Contains(ck.Value, testConsoleToken) || ck.Name != "idem_console_7464" {
		t.Errorf("the session cookie: %+v", ck)
	}
	if w := f.visit(t, "/", ck); w.Code != http.StatusOK {
		t.Errorf("with the cookie: %d", w.Code)
	}
	forged := *ck
	forged.Value = strings.Repeat("0", 32) + ".99999999999." + strings.Repeat("0", 64)
	if w := f.visit(t, "/", &forged); w.Code != http.StatusUnauthorized {
		t.Errorf("with a forged cookie: %d", w.Code)
	}
	raw := *ck
	raw.Value = testConsoleToken
	if w := f.visit(t, "/", &raw); w.Code != http.StatusUnauthorized {
		t.Errorf("with the raw token as the cookie: %d", w.Code)
	}
	// Authenticated already, the token is taken out of the address.
	if w := f.visit(t, "/failed?token="+testConsoleToken, ck); w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/failed" {
		t.Errorf("?token= with a session: %d %v", w.Code, w.Header())
	}
	for target, want := range map[string]string{
		"//evil.example/?token=" + testConsoleToken:          "/evil.example",
		"///evil.example/x?token=" + testConsoleToken:        "/evil.example/x",
		"/%5Cevil.example/?token=" + testConsoleToken:        "/evil.example",
		"/../../evil?a=1&token=" + testConsoleToken:          "/evil?a=1",
		"/release?key=a&scope=pay&token=" + testConsoleToken: "/release?key=a&scope=pay",
	} {
		w := f.visit(t, target)
		if loc := w.Header().Get("Location"); w.Code != http.StatusSeeOther || loc != want {
			t.Errorf("GET %s: %d to %q, want %q", target, w.Code, loc, want)
		}
		if u, err := url.Parse(w.Header().Get("Location")); err != nil || u.Host != "" || strings.HasPrefix(u.Path, "//") {
			t.Errorf("GET %s redirects off the console: %q", target, w.Header().Get("Location"))
		}
	}
}

// TestConsoleRateLimitsWrongTokens: a client's wrong tokens are answered
// 429 past a few, the right one too until the limit lifts, and each is
// logged; then the right token works again.
func TestConsoleRateLimitsWrongTokens(t *testing.T) {
	f := newConsoleFixture(t)
	session := f.visit(t, "/?token="+testConsoleToken).Result().Cookies()[0]
	wrong := func(r *http.Request) { r.Header.Set("Authorization", "Bearer guess") }
	limited := 0
	for range 50 {
		if code, _ := f.do(t, http.MethodGet, "/", nil, wrong); code == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited < 40 {
		t.Errorf("%d of 50 wrong guesses limited, want most of them", limited)
	}
	if code, _ := f.do(t, http.MethodGet, "/", nil, nil); code != http.StatusTooManyRequests {
		t.Errorf("the right token while limited: %d, want 429", code)
	}
	// A session opened before goes on: the guesses do not lock it out.
	if w := f.visit(t, "/", session); w.Code != http.StatusOK {
		t.Errorf("a valid session while its client is limited: %d, want 200", w.Code)
	}
	log := f.authLog.String()
	if !strings.Contains(log, "wrong token") || !strings.Contains(log, "client=192.0.2.1") || !strings.Contains(log, "too many wrong tokens") {
		t.Errorf("the log of wrong tokens:\n%s", log)
	}
	if strings.Contains(log, testConsoleToken) {
		t.Error("the log holds the token")
	}
	testenv.WaitUntil(t, 30*time.Second, "the limit lifted", func() bool {
		code, _ := f.do(t, http.MethodGet, "/", nil, nil)
		return code == http.StatusOK
	})
}

// TestConsoleRefusesAWeakToken: idem console does not start with a short
// or uniform token, on loopback or off it.
func TestConsoleRefusesAWeakToken(t *testing.T) {
	pgURL := testenv.PostgresURL(t)
	weak := filepath.Join(t.TempDir(), "weak")
	if err := os.WriteFile(weak, []byte("aaaaaaaaaaaaaaaaaaaaaaaa\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  map[string]string
		args []string
	}{
		{map[string]string{"IDEM_CONSOLE_TOKEN": "x", "IDEM_PG_URL": pgURL}, []string{"console", "--addr", "0.0.0.0:0"}},
		{map[string]string{"IDEM_CONSOLE_TOKEN": "x", "IDEM_PG_URL": pgURL}, []string{"console", "--addr", "127.0.0.1:0"}},
		{map[string]string{"IDEM_PG_URL": pgURL}, []string{"console", "--addr", "127.0.0.1:0", "--token-file", weak}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var out, errOut bytes.Buffer
		code := run(ctx, c.args, &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errOut, getenv: func(k string) string { return c.env[k] }})
		cancel()
		if code != exitUsage || !strings.Contains(errOut.String(), "weak") {
			t.Errorf("%v with a weak token: exit %d, want %d\n%s", c.args, code, exitUsage, errOut.String())
		}
	}
}

// TestConsoleStartsWithAGeneratedToken: on loopback without a token, the
// console draws one and prints the URL with it once; off loopback (by the
// address bound, not by the name) it does not start.
func TestConsoleStartsWithAGeneratedToken(t *testing.T) {
	_, schema := testenv.SchemaPool(t)
	envs := map[string]string{"IDEM_PG_URL": testenv.PostgresURL(t), "IDEM_PG_SCHEMA": schema}
	if code, _, _ := idem(t, "", envs, "migrate"); code != exitOK {
		t.Fatal("migrate")
	}
	ctx, cancel := context.WithCancel(context.Background())
	errOut := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"console", "--addr", "localhost:0"}, &env{stdin: strings.NewReader(""), stdout: &bytes.Buffer{}, stderr: errOut,
			getenv: func(k string) string { return envs[k] }})
	}()
	testenv.WaitUntil(t, 30*time.Second, "the console's URL", func() bool { return strings.Contains(errOut.String(), "?token=") })
	line := strings.TrimSpace(errOut.String())
	u, err := url.Parse(line[strings.Index(line, "http://"):])
	if err != nil || len(u.Query().Get("token")) < minTokenLen {
		t.Fatalf("the printed URL %q: %v", line, err)
	}
	tokenURL := u.String()
	u.RawQuery = ""
	resp, err := http.Get(u.String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET %s without the token: %d", u, resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, u.String(), nil)
	req.Header.Set("Authorization", "Bearer "+mustQuery(t, tokenURL, "token"))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s with the printed token: %d", u, resp.StatusCode)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("console: exit %d\n%s", code, errOut.String())
	}
	if code, _, errOut := idem(t, "", envs, "console", "--addr", "0.0.0.0:0"); code != exitUsage || !strings.Contains(errOut, "not loopback") {
		t.Errorf("console off loopback without a token: %d %q", code, errOut)
	}
}

func mustQuery(t *testing.T, s, name string) string {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query().Get(name)
}

// TestConsoleServerLimits: the server has read, write and idle timeouts,
// and a body past the limit is refused before it is read.
func TestConsoleServerLimits(t *testing.T) {
	srv := newConsoleServer(http.NotFoundHandler())
	if srv.ReadTimeout <= 0 || srv.ReadHeaderTimeout <= 0 || srv.IdleTimeout <= 0 || srv.WriteTimeout <= 0 || srv.MaxHeaderBytes <= 0 {
		t.Errorf("the console's server: %+v", srv)
	}
	f := newConsoleFixture(t)
	_, tok := f.dryRun(t, "/release?scope=pay&key=T03")
	big := url.Values{"action": {tok}, "pad": {strings.Repeat("x", 2*consoleBodyLimit)}}
	if code, _ := f.do(t, http.MethodPost, "/confirm", big, nil); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a %d-byte body: %d, want 413", len(big.Encode()), code)
	}
	if rows, _ := f.store.Admin().Find(context.Background(), "pay", "T03"); len(rows) != 1 {
		t.Error("a body past the limit released T03")
	}
}

// TestConsolePendingMapBoundPerSession: cross-site GETs without the
// session keep nothing; another session's thousand dry runs do not evict
// the operator's confirmation; nor can that session confirm it.
func TestConsolePendingMapBoundPerSession(t *testing.T) {
	f := newConsoleFixture(t)
	ckOf := func() *http.Cookie {
		w := f.visit(t, "/?token="+testConsoleToken)
		return w.Result().Cookies()[0]
	}
	operator, other := ckOf(), ckOf()
	as := func(ck *http.Cookie) func(*http.Request) {
		return func(r *http.Request) { r.Header.Del("Authorization"); r.AddCookie(ck) }
	}
	code, body := f.do(t, http.MethodGet, "/release?scope=pay&key=T03", nil, as(operator))
	m := actionToken.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("the operator's dry run: %d\n%s", code, body)
	}
	tok := m[1]
	crossSite := func(r *http.Request) {
		noAuth(r)
		r.Header.Set("Sec-Fetch-Site", "cross-site")
		r.Header.Set("Sec-Fetch-Dest", "image")
	}
	for range consolePending + 100 {
		f.do(t, http.MethodGet, "/release?scope=pay&key=T03", nil, crossSite)
		f.do(t, http.MethodGet, "/release?scope=pay&key=T03", nil, as(other))
	}
	f.console.mu.Lock()
	n := len(f.console.pending)
	f.console.mu.Unlock()
	if n > 1+consolePerSession {
		t.Errorf("%d unconfirmed actions kept, want at most %d", n, 1+consolePerSession)
	}
	if code, _ := f.confirm(t, tok, as(other)); code != http.StatusForbidden {
		t.Errorf("another session confirms the operator's action: %d, want 403", code)
	}
	if code, body := f.confirm(t, tok, as(operator)); code != http.StatusOK || !strings.Contains(body, "released pay T03") {
		t.Errorf("the operator's confirmation after the flood: %d\n%s", code, body)
	}
}

// TestConsoleReleaseBoundToTheRowShown: a failed row recorded again after
// the dry run (a new incident) is not released by its confirmation.
func TestConsoleReleaseBoundToTheRowShown(t *testing.T) {
	f := newConsoleFixture(t)
	ctx := testenv.Context(t, time.Minute)
	_, tok := f.dryRun(t, "/release?scope=pay&key=T03")
	// Released elsewhere, then a new incident with another reason.
	if _, err := f.store.Admin().Release(ctx, []dedup.Key{{Scope: "pay", ID: "T03"}}, false); err != nil {
		t.Fatal(err)
	}
	claim := dedup.Claim{Key: dedup.Key{Scope: "pay", ID: "T03"}, Fingerprint: dedup.FingerprintOf([]byte("T03")), Source: "pay/1/99"}
	if err := f.store.RecordFailure(ctx, claim, "account closed for fraud"); err != nil {
		t.Fatal(err)
	}
	code, body := f.confirm(t, tok, nil)
	if code != http.StatusConflict || !strings.Contains(body, "changed since the dry run") {
		t.Errorf("the confirmation of a row that changed: %d\n%s", code, body)
	}
	if rows, err := f.store.Admin().Find(ctx, "pay", "T03"); err != nil || len(rows) != 1 || rows[0].Reason != "account closed for fraud" {
		t.Errorf("the new incident was released unseen: %v %+v", err, rows)
	}
}

// TestConsoleSameSiteNavigationKeepsNothing: a link on another port of
// the host, followed in a tab, still shows the dry run (the operator may
// keep links to the console elsewhere) but keeps no action and offers no
// confirmation; the same URL as an <img> from that page is refused.
func TestConsoleSameSiteNavigationKeepsNothing(t *testing.T) {
	f := newConsoleFixture(t)
	from := func(mode, dest string) func(*http.Request) {
		return func(r *http.Request) {
			r.Header.Set("Sec-Fetch-Site", "same-site")
			r.Header.Set("Sec-Fetch-Mode", mode)
			r.Header.Set("Sec-Fetch-Dest", dest)
		}
	}
	code, body := f.do(t, http.MethodGet, "/release?scope=pay&key=T03", nil, from("navigate", "document"))
	if code != http.StatusOK || actionToken.MatchString(body) || !strings.Contains(body, "would release") || !strings.Contains(body, "no confirmation") {
		t.Errorf("a same-site link to a dry run: %d, want the dry run without a confirmation:\n%s", code, body)
	}
	if code, body := f.do(t, http.MethodGet, "/release?scope=pay&key=T03", nil, from("no-cors", "image")); code != http.StatusForbidden {
		t.Errorf("a same-site <img> of a dry run: %d, want 403: %s", code, errorLine(body))
	}
	f.console.mu.Lock()
	n := len(f.console.pending)
	f.console.mu.Unlock()
	if n != 0 {
		t.Errorf("%d actions kept for requests from another page, want 0", n)
	}
	// The console's own pages, the address bar and scripts keep theirs.
	f.dryRun(t, "/release?scope=pay&key=T03")
	for _, site := range []string{"none", ""} {
		code, body := f.do(t, http.MethodGet, "/release?scope=pay&key=T03", nil, func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", site) })
		if code != http.StatusOK || !actionToken.MatchString(body) {
			t.Errorf("a dry run with Sec-Fetch-Site %q: %d, no confirmation", site, code)
		}
	}
}

// TestConsoleBearerSchemeIsCaseInsensitive: the Authorization scheme is
// case-insensitive (RFC 9110): "bearer TOKEN" is the token.
func TestConsoleBearerSchemeIsCaseInsensitive(t *testing.T) {
	_, srv := authOnlyConsole(t, io.Discard)
	for _, scheme := range []string{"bearer", "BEARER", "Bearer"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		req.Header.Set("Authorization", scheme+" "+testConsoleToken)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("Authorization: %s TOKEN: %d, want 200", scheme, resp.StatusCode)
		}
	}
}

// TestConsoleAcceptsDrawnTokens: the strength check refuses guessable
// tokens, not random ones: the console's own and openssl rand -hex 16's.
func TestConsoleAcceptsDrawnTokens(t *testing.T) {
	for range 2000 {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		for _, tok := range []string{newToken(), hex.EncodeToString(b)} {
			if err := checkToken(tok); err != nil {
				t.Fatalf("a random token %q: %v", tok, err)
			}
		}
	}
}
