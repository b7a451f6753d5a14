package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
)

// The console's authentication and limits.
const (
	minTokenLen        = 16                // characters of a token given by the operator
	minTokenDistinct   = 8                 // distinct characters among them
	minTokenBits       = 80                // bits of entropy, as tokenBits estimates them
	consoleSessionTTL  = 12 * time.Hour    // a session cookie is good this long
	consoleBodyLimit   = 64 << 10          // bytes of a request body
	authFailBurst      = 5                 // wrong credentials a client may present at once
	authFailEvery      = time.Second       // then one per this
	authClientsTracked = 10000             // clients whose failures are remembered
	consolePerSession  = 32                // unconfirmed actions kept per session
	consoleSessionCtx  = ctxKey("session") // the request's session, for the pending map and the audit log
)

type ctxKey string

// errWeakToken is returned for a token that could be guessed.
var errWeakToken = fmt.Errorf("the console token is weak: it needs about %d bits of entropy (32 random hex digits have 128; sequences, repeats, keyboard walks and common words count for little) and at least %d characters, %d of them different; draw one with openssl rand -hex 32, or start the console without a token to have it draw one", minTokenBits, minTokenLen, minTokenDistinct)

// consoleAuth is the console's authentication: every request carries the
// token, as a bearer token (Authorization: Bearer TOKEN) or a session
// cookie that the first visit with ?token=TOKEN sets. The cookie holds a
// session value derived from the token (an HMAC with a key drawn at
// start), never the token: a cookie read elsewhere (browsers send it to
// every port of the host name) does not give the token away, and it ends
// with its TTL or the console's restart. Wrong credentials are limited
// per client and logged.
type consoleAuth struct {
	token  string
	name   string // who the token is, in the audit log
	key    []byte // the session values' HMAC key
	secure bool   // Secure cookie named __Host-…: behind HTTPS
	cookie string
	log    *slog.Logger
	now    func() time.Time

	mu    sync.Mutex
	fails map[string]*failBucket
}

type failBucket struct {
	tokens float64
	last   time.Time
	logged bool // limited, and said so
}

// newConsoleAuth checks the token's strength and derives the session key.
// port names the cookie, so that consoles on different ports of a host
// do not overwrite each other's.
func newConsoleAuth(token, name, port string, secure bool, log *slog.Logger) (*consoleAuth, error) {
	if err := checkToken(token); err != nil {
		return nil, err
	}
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write(nonce)
	a := &consoleAuth{token: token, name: name, key: m.Sum(nil), secure: secure, log: log, now: time.Now, fails: map[string]*failBucket{}}
	a.cookie = "idem_console_" + port
	if secure {
		a.cookie = "__Host-idem_console"
	}
	return a, nil
}

// checkToken refuses a token that could be guessed: shorter than
// minTokenLen, with fewer than minTokenDistinct different characters, or
// worth less than minTokenBits by tokenBits' estimate.
func checkToken(token string) error {
	distinct := map[rune]bool{}
	for _, r := range token {
		distinct[r] = true
	}
	if len([]rune(token)) < minTokenLen || len(distinct) < minTokenDistinct || tokenBits(token) < minTokenBits {
		return errWeakToken
	}
	return nil
}

// weakWords are words people put in passwords; in a token, each adds
// next to nothing to a guesser's work.
var weakWords = []string{"password", "passwd", "secret", "letmein", "admin", "changeme", "welcome", "qwerty", "azerty", "dragon", "monkey"}

// keyboardRows are the rows of common keyboard layouts, for walks along
// them.
var keyboardRows = []string{"`1234567890-=", "qwertyuiop[]\\", "asdfghjkl;'", "zxcvbnm,./", "azertyuiop", "qsdfghjklm", "wxcvbn", "qwertzuiop", "yxcvbnm"}

// tokenBits estimates a token's entropy in bits as a guesser who knows
// people's habits would: each character is worth log2 of the alphabet
// the token's characters span (alphabet), except that a character which
// continues a run — the third and later of a repeat (aaaa), a sequence
// (abcd, 4321) or a walk along a keyboard row (qwer) — and the letters of
// a common password word after its first are worth one bit each.
func tokenBits(token string) float64 {
	rs := []rune(strings.ToLower(token))
	cheap := make([]bool, len(rs))
	for i := range rs {
		for _, w := range weakWords {
			if strings.HasPrefix(string(rs[i:]), w) {
				for j := i + 1; j < i+len(w); j++ {
					cheap[j] = true
				}
			}
		}
		if i >= 2 {
			if s := step(rs[i-1], rs[i]); s != 0 && s == step(rs[i-2], rs[i-1]) {
				cheap[i] = true
			}
		}
	}
	per := math.Log2(float64(alphabet(token)))
	bits := 0.0
	for _, c := range cheap {
		if c {
			bits++
		} else {
			bits += per
		}
	}
	return bits
}

// step names how b follows a: a repeat (1), the next or the previous
// code point (2, 3), the next or the previous key on keyboard row r
// (4+2r, 5+2r); 0 for none of these.
func step(a, b rune) int {
	switch b - a {
	case 0:
		return 1
	case 1:
		return 2
	case -1:
		return 3
	}
	for r, row := range keyboardRows {
		i, j := strings.IndexRune(row, a), strings.IndexRune(row, b)
		switch {
		case i < 0 || j < 0:
		case j == i+1:
			return 4 + 2*r
		case j == i-1:
			return 5 + 2*r
		}
	}
	return 0
}

// alphabet is the size of the alphabet a token's characters come from:
// 16 for hex digits (of one case), else the sum of the classes it uses
// (26 lower-case letters, 26 upper-case, 10 digits, 33 others).
func alphabet(token string) int {
	notIn := func(set string) func(rune) bool {
		return func(r rune) bool { return !strings.ContainsRune(set, r) }
	}
	if !strings.ContainsFunc(token, notIn("0123456789abcdef")) || !strings.ContainsFunc(token, notIn("0123456789ABCDEF")) {
		return 16
	}
	n := 0
	for _, class := range []struct {
		in   func(rune) bool
		size int
	}{
		{func(r rune) bool { return 'a' <= r && r <= 'z' }, 26},
		{func(r rune) bool { return 'A' <= r && r <= 'Z' }, 26},
		{func(r rune) bool { return '0' <= r && r <= '9' }, 10},
		{func(r rune) bool { return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') }, 33},
	} {
		if strings.ContainsFunc(token, class.in) {
			n += class.size
		}
	}
	return n
}

// newToken draws a token for a console started without one.
func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (a *consoleAuth) tokenOK(s string) bool {
	return subtle.ConstantTimeCompare([]byte(s), []byte(a.token)) == 1
}

// session returns a new session value: an id of its own, its expiry
// and their MAC.
func (a *consoleAuth) session() string {
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	body := hex.EncodeToString(id) + "." + strconv.FormatInt(a.now().Add(consoleSessionTTL).Unix(), 10)
	return body + "." + a.mac(body)
}

func (a *consoleAuth) mac(body string) string {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte("idem console session " + body))
	return hex.EncodeToString(m.Sum(nil))
}

func (a *consoleAuth) sessionOK(v string) bool {
	i := strings.LastIndexByte(v, '.')
	if i < 0 {
		return false
	}
	body, mac := v[:i], v[i+1:]
	_, exp, ok := strings.Cut(body, ".")
	if !ok {
		return false
	}
	sec, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || a.now().Unix() >= sec {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(a.mac(body)))
}

// authenticate returns the request's session, the name the pending map
// and the audit log know it by: "bearer", or the cookie's session value.
// ok is false without valid credentials; presented tells whether wrong
// ones were given (counted against the client).
func (a *consoleAuth) authenticate(r *http.Request) (session string, ok, presented bool) {
	if s, ok := a.sessionCookie(r); ok {
		return s, true, true
	}
	// The scheme is case-insensitive (RFC 9110, section 11.1).
	if scheme, b, found := strings.Cut(r.Header.Get("Authorization"), " "); found && strings.EqualFold(scheme, "Bearer") {
		if a.tokenOK(strings.TrimLeft(b, " ")) {
			return "bearer", true, true
		}
		presented = true
	}
	if _, err := r.Cookie(a.cookie); err == nil {
		presented = true // and not valid
	}
	if r.URL.Query().Has("token") {
		presented = true
	}
	return "", false, presented
}

// sessionCookie returns the request's session cookie, if it is valid.
func (a *consoleAuth) sessionCookie(r *http.Request) (string, bool) {
	ck, err := r.Cookie(a.cookie)
	if err != nil || !a.sessionOK(ck.Value) {
		return "", false
	}
	return ck.Value, true
}

// client is who a request's failures are counted against: its address.
// Behind a proxy every request comes from the proxy (docs/operating.md).
func client(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// limitedAs is the bucket a client's failures go to: its address, and
// every loopback address one bucket, since any local user sends from all
// of 127.0.0.0/8.
func limitedAs(c string) string {
	if ip := net.ParseIP(c); ip != nil && ip.IsLoopback() {
		return "loopback"
	}
	return c
}

// limited reports whether a client has used up its wrong guesses.
func (a *consoleAuth) limited(c string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.bucket(limitedAs(c))
	return b.tokens < 1
}

// bucket refills and returns a client's bucket; a.mu is held.
func (a *consoleAuth) bucket(c string) *failBucket {
	now := a.now()
	b := a.fails[c]
	if b == nil {
		if len(a.fails) >= authClientsTracked {
			for k, v := range a.fails {
				if now.Sub(v.last) > authFailBurst*authFailEvery {
					delete(a.fails, k)
				}
			}
			if len(a.fails) >= authClientsTracked {
				a.fails = map[string]*failBucket{} // a flood of addresses: start again
			}
		}
		b = &failBucket{tokens: authFailBurst, last: now}
		a.fails[c] = b
	}
	b.tokens = min(authFailBurst, b.tokens+float64(now.Sub(b.last))/float64(authFailEvery))
	b.last = now
	if b.tokens >= 1 {
		b.logged = false
	}
	return b
}

// fail counts a wrong credential against a client, and logs it.
func (a *consoleAuth) fail(r *http.Request) {
	c := client(r)
	a.mu.Lock()
	b := a.bucket(limitedAs(c))
	b.tokens--
	limited := b.tokens < 1 && !b.logged
	if limited {
		b.logged = true
	}
	a.mu.Unlock()
	a.log.Warn("idem console: wrong token", "client", c, "method", r.Method, "path", inert(r.URL.Path), "user_agent", inert(r.UserAgent()))
	if limited {
		a.log.Warn("idem console: too many wrong tokens; refusing the client's requests for a while", "client", c, "retry_after", authFailEvery)
	}
}

// safeRedirect is where a visit with ?token= goes once its cookie is set:
// the same path on this console, without the token; never another host.
func safeRedirect(u *url.URL) string {
	p := path.Clean("/" + strings.TrimLeft(u.Path, "/\\"))
	// A browser drops tabs and newlines from a Location before resolving
	// it: /<TAB>/host would be //host, another host.
	if strings.ContainsAny(p, "\\") || strings.ContainsFunc(p, unicode.IsControl) {
		p = "/"
	}
	q := u.Query()
	q.Del("token")
	if len(q) > 0 {
		return p + "?" + q.Encode()
	}
	return p
}

// guard is the console's front: security headers, the body limit, the
// Host check (DNS rebinding) on loopback, and authentication.
func (c *console) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if r.ContentLength > consoleBodyLimit {
			http.Error(w, "idem console: request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, consoleBodyLimit)
		if c.checkHost {
			host := r.Host
			if hh, _, err := net.SplitHostPort(host); err == nil {
				host = hh
			}
			if !isLoopbackName(host) {
				http.Error(w, "idem console: Host "+strconv.Quote(r.Host)+" is not a loopback name (the console listens on loopback)", http.StatusMisdirectedRequest)
				return
			}
		}
		if !fromConsoleOrNavigation(r) {
			http.Error(w, "idem console: a request from another page (Sec-Fetch-Site "+strconv.Quote(r.Header.Get("Sec-Fetch-Site"))+", "+
				strconv.Quote(r.Header.Get("Sec-Fetch-Dest"))+") is refused: open the console's pages from the console, or as a link in a browser tab", http.StatusForbidden)
			return
		}
		a := c.auth
		if a == nil {
			http.Error(w, "idem console: no token configured", http.StatusInternalServerError)
			return
		}
		// A valid session cookie passes even while its client is limited:
		// guessing one is guessing an HMAC, and on a shared host another
		// local user's wrong tokens must not lock the operator out.
		session, ok := a.sessionCookie(r)
		if !ok && a.limited(client(r)) {
			h.Set("Retry-After", strconv.Itoa(int(authFailEvery/time.Second)))
			http.Error(w, "idem console: too many wrong tokens from "+client(r)+"; try again later", http.StatusTooManyRequests)
			return
		}
		presented := false
		if !ok {
			session, ok, presented = a.authenticate(r)
		}
		if !ok && r.Method == http.MethodGet {
			if q := r.URL.Query().Get("token"); q != "" && a.tokenOK(q) {
				http.SetCookie(w, &http.Cookie{Name: a.cookie, Value: a.session(), Path: "/", MaxAge: int(consoleSessionTTL / time.Second),
					HttpOnly: true, Secure: a.secure, SameSite: http.SameSiteStrictMode})
				http.Redirect(w, r, safeRedirect(r.URL), http.StatusSeeOther)
				return
			}
		}
		if !ok {
			if presented {
				a.fail(r)
			}
			http.Error(w, "idem console: a token is required: open the console with the URL it printed at start (?token=…), or send Authorization: Bearer TOKEN", http.StatusUnauthorized)
			return
		}
		if r.URL.Query().Has("token") {
			// Authenticated already: the token leaves the address bar.
			http.Redirect(w, r, safeRedirect(r.URL), http.StatusSeeOther)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), consoleSessionCtx, session)))
	})
}

// fromConsoleOrNavigation reports whether a request comes from the
// console's own pages, the operator's address bar, a client that is not a
// browser, or a top-level navigation (a link followed in a tab). Anything
// else a browser sends (an <img>, a <script>, a fetch, an <iframe>) from
// another page is refused: SameSite=Strict keeps the session cookie from
// other sites, but every port of the console's host is the same site, so
// a page any local user serves on 127.0.0.1:8080 makes the operator's
// browser send the cookie with its images. Browsers without Fetch
// Metadata (Sec-Fetch-*, since 2020-2023) are not protected this way.
func fromConsoleOrNavigation(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return true
	}
	return r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Header.Get("Sec-Fetch-Dest") == "document"
}

// mayKeep reports whether a dry run may keep its action for a
// confirmation: only when the console's own pages, the address bar or a
// client that is not a browser asked for it. A same-site page can still
// navigate the operator's tab to a dry run (fromConsoleOrNavigation); it
// does not get to keep actions in the operator's session, which holds
// consolePerSession and forgets the oldest past that.
func mayKeep(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return true
	}
	return false
}

// sessionOf is the session guard authenticated the request with.
func sessionOf(r *http.Request) string {
	s, _ := r.Context().Value(consoleSessionCtx).(string)
	return s
}

// newConsoleServer is the console's HTTP server, with every timeout set: a
// client that sends slowly, or keeps a connection idle, does not hold it.
// The write timeout leaves room for a confirmed action (2 minutes).
func newConsoleServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 3 * time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
}
