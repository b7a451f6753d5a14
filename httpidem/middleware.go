package httpidem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/dedup"
)

// Middleware puts requests carrying an Idempotency-Key under the keys of a
// store, in one of two modes per route: Transactional, whose handler writes
// in the store's transaction, or Leased, for handlers whose effects are
// elsewhere. Safe for concurrent use; one Middleware serves every route of
// a process (it knows which keys the process is executing).
type Middleware[TTx any] struct {
	store    dedup.RequestStore[TTx]
	tenant   func(*http.Request) (string, error)
	log      *slog.Logger
	obs      Observer
	marks    dedup.Watermarks[TTx] // the store's entity watermarks, if it keeps them (Route.Entity)
	inflight inflight
}

// New returns a Middleware, or an error naming what is wrong in cfg.
func New[TTx any](cfg Config[TTx]) (*Middleware[TTx], error) {
	if cfg.Store == nil {
		return nil, errors.New("httpidem: Config.Store is nil")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	marks, _ := cfg.Store.(dedup.Watermarks[TTx])
	return &Middleware[TTx]{store: cfg.Store, tenant: cfg.Tenant, log: cfg.Logger, obs: cfg.Observer, marks: marks}, nil
}

// TxHandler handles a request in the store's transaction tx. Its writes in
// tx, the key and the response commit together — or nothing does.
//
// Returning nil commits whatever the handler wrote, whatever the status: a
// 201, or a 400 or 500 the handler chose to answer with, is stored and
// replayed to every retry with the key (Stripe's rule). Returning an error
// rolls everything back and stores nothing: the client gets a 500 problem
// (503 when the database is unavailable), and a retry with the key runs the
// handler again — safe, nothing committed. The handler never commits or
// rolls back tx itself.
type TxHandler[TTx any] interface {
	ServeTx(w http.ResponseWriter, r *http.Request, tx TTx) error
}

// TxHandlerFunc is a function as a TxHandler.
type TxHandlerFunc[TTx any] func(w http.ResponseWriter, r *http.Request, tx TTx) error

// ServeTx calls f.
func (f TxHandlerFunc[TTx]) ServeTx(w http.ResponseWriter, r *http.Request, tx TTx) error {
	return f(w, r, tx)
}

// Transactional returns an http.Handler that runs h in the store's
// transaction, under the request's key: exactly once per key, no lease.
//
//	new key                  h runs; its writes, the key and the response commit together
//	finished key             the stored status, headers and body, with Idempotent-Replayed: true
//	key executing elsewhere  409 Conflict with Retry-After, at once
//	another request's key    422 (method, route or body fingerprint differ)
//	no key / a bad key       400 (unless Route.Optional: no key runs h without one; Route.Key: from the body)
//	body over the limit      413, before any store work
//
// The response is buffered and sent after COMMIT. It panics when route is
// invalid, as http.ServeMux.Handle does for a bad pattern.
func (m *Middleware[TTx]) Transactional(route Route, h TxHandler[TTx]) http.Handler {
	rt, err := route.resolve(false)
	if err != nil {
		panic(err)
	}
	if h == nil {
		panic("httpidem: Transactional: nil handler")
	}
	if rt.Entity != nil && m.marks == nil {
		panic(fmt.Errorf("httpidem: Route.Entity is set, but Config.Store (%T) keeps no entity watermarks (it does not implement dedup.Watermarks): use pgstore or sqlitestore", m.store))
	}
	return &txRoute[TTx]{m: m, rt: rt, h: h}
}

// Leased returns middleware for handlers whose effects lie outside the
// store's database (a payment provider, an e-mail): the key is committed
// as Processing under a lease with a fencing token before the handler runs
// (LeaseFrom gives it to the handler).
//
//	new key                       the handler runs under a lease with a fresh token
//	handler answers < 500         the response is stored (Finished) and replayed from then on
//	handler answers 5xx, panics   the outcome is uncertain: nothing stored, the lease runs on;
//	or the process dies           retries get 409 until it runs out, then one takes over (a larger token)
//	finished key                  the stored response, Idempotent-Replayed: true
//	lease running                 409 Conflict, Retry-After the lease's remaining time
//	another request's key         422; no key or a bad key 400; body over the limit 413
//
// A holder whose lease was taken over cannot store its response: the
// store refuses the stale token, and its client gets 409. It panics when
// route is invalid.
func (m *Middleware[TTx]) Leased(route Route) func(http.Handler) http.Handler {
	rt, err := route.resolve(true)
	if err != nil {
		panic(err)
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("httpidem: Leased: nil handler")
		}
		return &leaseRoute[TTx]{m: m, rt: rt, next: next}
	}
}

// Scope is the scope of the keys of a route, as the middleware builds it:
// the method, a space, the route, and "#" and the tenant when there is one.
// For operators who look a key up (StuckRequests lists them with it). The
// path values are not in the scope but in the fingerprint: a key is one
// request to one resource, and its reuse on another resource of the route
// is answered 422 rather than run as a new key.
func Scope(method, route, tenant string) string {
	if tenant == "" {
		return method + " " + route
	}
	return method + " " + route + "#" + tenant
}

// prepared is a request that passed the checks before the store.
type prepared struct {
	r      *http.Request // with its body buffered, when it has a key
	keyed  bool
	claim  dedup.Claim
	entity Entity // Route.Entity's, for a keyed request
}

// prepare checks a request's body size and key, reads its body and
// fingerprints it. It answers the request itself and returns false when it
// cannot go on.
func (m *Middleware[TTx]) prepare(w http.ResponseWriter, r *http.Request, rt *route) (prepared, bool) {
	if r.ContentLength > rt.MaxRequestBytes {
		note(r, OutcomeTooLarge, nil)
		writeProblem(w, http.StatusRequestEntityTooLarge, titleTooLarge,
			fmt.Sprintf("The body is %d bytes; the limit is %d.", r.ContentLength, rt.MaxRequestBytes), 0)
		return prepared{}, false
	}
	body := r.Body
	if body == nil {
		body = http.NoBody
	}
	var raw []byte
	var id string
	var err error
	if rt.Key != nil {
		if raw, err = readBody(w, r, body, rt); err != nil {
			return prepared{}, false
		}
		id, err = rt.keyFrom(r, raw)
	} else {
		id, err = keyOf(r, rt.Header)
	}
	switch {
	case errors.Is(err, errNoKey) && rt.Optional:
		note(r, OutcomeUnkeyed, nil)
		r2 := r.WithContext(r.Context())
		r2.Body = http.MaxBytesReader(w, body, rt.MaxRequestBytes)
		return prepared{r: r2}, true
	case errors.Is(err, errNoKey):
		note(r, OutcomeBadKey, nil)
		writeProblem(w, http.StatusBadRequest, titleMissing,
			"This operation is idempotent and requires an "+rt.Header+" header.", 0)
		return prepared{}, false
	case err != nil:
		note(r, OutcomeBadKey, nil)
		title := titleInvalid
		if rt.Key != nil {
			title = titleNoKey
		}
		writeProblem(w, http.StatusBadRequest, title, err.Error()+".", 0)
		return prepared{}, false
	}
	name, err := rt.name(r)
	if err != nil {
		m.serverError(w, r, "route", err)
		return prepared{}, false
	}
	tenant := ""
	if m.tenant != nil {
		if tenant, err = m.tenant(r); err != nil {
			m.serverError(w, r, "tenant", err)
			return prepared{}, false
		}
	}
	key := dedup.Key{Scope: Scope(r.Method, name, tenant), ID: id}
	if err := key.Validate(); err != nil {
		// The ID passed; the scope is the server's: a tenant too long or
		// with control characters. Never truncated.
		m.serverError(w, r, "scope", fmt.Errorf("method, route and tenant make no valid scope: %w", err))
		return prepared{}, false
	}
	noteKey(r, dedup.RequestRecord{Key: key})
	if rt.Key == nil {
		if raw, err = readBody(w, r, body, rt); err != nil {
			return prepared{}, false
		}
	}
	fp, err := rt.Fingerprint(r, raw)
	if err != nil {
		note(r, OutcomeBadRequest, err)
		writeProblem(w, http.StatusBadRequest, titleBadBody, err.Error(), 0)
		return prepared{}, false
	}
	r2 := r.WithContext(context.WithValue(r.Context(), idKey{}, id))
	r2.Body = io.NopCloser(bytes.NewReader(raw))
	r2.ContentLength = int64(len(raw))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }
	var ent Entity
	if rt.Entity != nil {
		if ent, err = rt.entityOf(r2, raw); err != nil {
			note(r, OutcomeBadRequest, err)
			writeProblem(w, http.StatusBadRequest, titleEntity, err.Error(), 0)
			return prepared{}, false
		}
	}
	var paths []pathValue
	if !rt.IgnorePathValues {
		paths = pathValues(r)
	}
	return prepared{r: r2, keyed: true, entity: ent, claim: dedup.Claim{
		Key:         key,
		Fingerprint: requestFingerprint(r.Method, name, paths, fp),
		Source:      source(r),
	}}, true
}

// readBody reads the request's body within Route.MaxRequestBytes. It
// answers the request itself (413, or 400) when it returns an error.
func readBody(w http.ResponseWriter, r *http.Request, body io.ReadCloser, rt *route) ([]byte, error) {
	raw, err := io.ReadAll(http.MaxBytesReader(w, body, rt.MaxRequestBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			note(r, OutcomeTooLarge, nil)
			writeProblem(w, http.StatusRequestEntityTooLarge, titleTooLarge,
				fmt.Sprintf("The body is larger than the limit of %d bytes.", rt.MaxRequestBytes), 0)
		} else {
			note(r, OutcomeBadRequest, err)
			writeProblem(w, http.StatusBadRequest, "The request body could not be read", err.Error(), 0)
		}
	}
	return raw, err
}

// source is the request's method and path for the dedup row's audit column:
// control characters replaced, valid UTF-8, at most 200 bytes.
func source(r *http.Request) string {
	s := strings.ToValidUTF8(r.Method+" "+r.URL.Path, "?")
	s = strings.Map(func(c rune) rune {
		if unicode.IsControl(c) {
			return '?'
		}
		return c
	}, s)
	if len(s) > 200 {
		cut := 200
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// panicError is a handler's panic, recovered.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("handler panicked: %v", p.value) }

type txRoute[TTx any] struct {
	m  *Middleware[TTx]
	rt *route
	h  TxHandler[TTx]
}

func (t *txRoute[TTx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m, rt := t.m, t.rt
	w, r, observed := m.observe(w, r, rt, false)
	defer observed()
	p, ok := m.prepare(w, r, rt)
	if !ok {
		return
	}
	k := p.claim.Key
	if p.keyed {
		if !m.inflight.acquire(k) {
			m.answer(w, p.r, dedup.RequestRecord{Key: k, Verdict: dedup.VerdictBusy})
			return
		}
		defer m.inflight.release(k)
	}
	cw := newCapture(rt.MaxResponseBytes)
	var handlerErr error
	stale := false
	run := func(ctx context.Context, tx TTx) (dedup.StoredResponse, error) {
		if p.entity.Name != "" {
			s, ok, err := m.advance(ctx, tx, p)
			if err != nil {
				return dedup.StoredResponse{}, err
			}
			if stale = ok; stale {
				answer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { rt.Stale(w, r, s) })
				if handlerErr = serveHTTP(answer, cw, p.r); handlerErr != nil {
					return dedup.StoredResponse{}, handlerErr
				}
				cw.finish()
				return cw.response(rt.stored), nil
			}
		}
		if handlerErr = serveTx(t.h, cw, p.r, tx); handlerErr != nil {
			return dedup.StoredResponse{}, handlerErr
		}
		if cw.tooLarge {
			handlerErr = fmt.Errorf("%w: more than %d bytes (Route.MaxResponseBytes)", ErrResponseTooLarge, rt.MaxResponseBytes)
			return dedup.StoredResponse{}, handlerErr
		}
		cw.finish()
		return cw.response(rt.stored), nil
	}
	var rec dedup.RequestRecord
	var err error
	if p.keyed {
		rec, err = m.store.RunRequest(p.r.Context(), p.claim, rt.Retention, run)
	} else {
		rec.Verdict = dedup.VerdictRun
		err = m.store.InTx(p.r.Context(), func(ctx context.Context, tx TTx) error {
			_, err := run(ctx, tx)
			return err
		})
	}
	switch {
	case err == nil && rec.Verdict == dedup.VerdictRun:
		switch {
		case stale:
			note(p.r, OutcomeStale, nil)
		case p.keyed:
			note(p.r, OutcomeExecuted, nil)
		}
		cw.send(w)
	case err == nil:
		m.answer(w, p.r, rec)
	case handlerErr != nil:
		// err wraps handlerErr, and says when the connection was lost.
		m.handlerFailed(w, p.r, k, err,
			"Nothing was stored and nothing committed: a retry with the same key runs the request again.")
	default:
		m.storeFailed(w, p.r, k, err)
	}
}

// serveTx runs a transactional handler, its panic recovered as an error so
// that the transaction rolls back the usual way.
func serveTx[TTx any](h TxHandler[TTx], w http.ResponseWriter, r *http.Request, tx TTx) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	return h.ServeTx(w, r, tx)
}

// serveHTTP runs a handler, its panic recovered.
func serveHTTP(h http.Handler, w http.ResponseWriter, r *http.Request) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	h.ServeHTTP(w, r)
	return nil
}

type leaseRoute[TTx any] struct {
	m    *Middleware[TTx]
	rt   *route
	next http.Handler
}

// storeTimeout bounds the store writes after a leased handler, which run
// even when the client has gone: the outcome must be recorded.
const storeTimeout = 30 * time.Second

func (l *leaseRoute[TTx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m, rt := l.m, l.rt
	w, r, observed := m.observe(w, r, rt, true)
	defer observed()
	p, ok := m.prepare(w, r, rt)
	if !ok {
		return
	}
	if !p.keyed {
		l.next.ServeHTTP(w, p.r) // no key: no lease, no buffering
		return
	}
	// No in-process shortcut here: the committed lease tells every process
	// (this one included) that the key is held, and its expiry lets a
	// request take over from a holder hung in this very process.
	k := p.claim.Key
	rec, err := m.store.AcquireLease(p.r.Context(), p.claim, rt.Retention, rt.Lease)
	if err != nil {
		m.storeFailed(w, p.r, k, err)
		return
	}
	if rec.Verdict != dedup.VerdictRun {
		m.answer(w, p.r, rec)
		return
	}
	noteKey(p.r, rec)
	note(p.r, OutcomeExecuted, nil)
	lease := &Lease{store: m.leaseStore(), key: k, fp: p.claim.Fingerprint, token: rec.Token, takenOver: rec.Takeover, lease: rt.Lease, expires: time.Now().Add(rec.LeaseLeft)}
	cw := newCapture(rt.MaxResponseBytes)
	herr := serveHTTP(l.next, cw, p.r.WithContext(context.WithValue(p.r.Context(), leaseKey{}, lease)))
	cw.finish()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.r.Context()), storeTimeout)
	defer cancel()
	switch {
	case herr != nil:
		m.handlerFailed(w, p.r, k, herr,
			"The outcome is uncertain: a retry with the same key takes the request over once its lease runs out.")
	case lease.isEnded():
		cw.send(w) // given up without an outcome: not stored
	case cw.tooLarge:
		// The effects happened; the response cannot be stored. Storing
		// this problem instead keeps retries from repeating them.
		res := problemResponse(http.StatusInternalServerError, titleRespSize,
			fmt.Sprintf("The request was executed, but its response is more than %d bytes (Route.MaxResponseBytes) and was not stored.", rt.MaxResponseBytes))
		if err := m.store.FinishLease(ctx, k, lease.token, res); err != nil {
			m.log.ErrorContext(ctx, "httpidem: storing the outcome of a leased request", "scope", k.Scope, "key", k.ID, "err", err)
		}
		m.log.ErrorContext(ctx, "httpidem: response too large to store", "scope", k.Scope, "key", k.ID, "limit", rt.MaxResponseBytes)
		note(p.r, OutcomeFailed, ErrResponseTooLarge)
		_ = replay(w, res, false)
	case cw.status >= 500:
		note(p.r, OutcomeFailed, nil)
		cw.send(w) // uncertain: not stored, the lease runs on
	default:
		err := m.store.FinishLease(ctx, k, lease.token, cw.response(rt.stored))
		switch {
		case errors.Is(err, dedup.ErrLeaseLost):
			note(p.r, OutcomeLeaseLost, err)
			m.fenced(ctx, k, "finish")
			writeProblem(w, http.StatusConflict, titleLost,
				"This request's lease ran out and another request with the same key took it over (or an operator released it); its outcome stands, and this response was not stored.", 0)
		case err != nil:
			// The effects happened: the client gets the response. The key
			// stays Processing; a retry takes it over after the lease.
			m.log.ErrorContext(ctx, "httpidem: storing the response of a leased request", "scope", k.Scope, "key", k.ID, "err", err)
			cw.send(w)
		default:
			cw.send(w)
		}
	}
}

// answer responds for a key that is not this request's to run.
func (m *Middleware[TTx]) answer(w http.ResponseWriter, r *http.Request, rec dedup.RequestRecord) {
	noteKey(r, rec)
	switch rec.Verdict {
	case dedup.VerdictReplay:
		note(r, OutcomeReplayed, nil)
		if err := replay(w, rec.Response, true); err != nil {
			m.serverError(w, r, "replay", err)
		}
	case dedup.VerdictMismatch:
		note(r, OutcomeMismatch, nil)
		writeProblem(w, http.StatusUnprocessableEntity, titleMismatch,
			"This key was used for a different request (another method, route, resource in the path, or body): an Idempotency-Key must not be reused for another request.", 0)
	default:
		note(r, OutcomeInFlight, nil)
		writeProblem(w, http.StatusConflict, titleBusy,
			"A request with the same Idempotency-Key is being processed; retry once it has finished.", max(rec.LeaseLeft, time.Second))
	}
}

// handlerFailed answers a handler's error or panic.
func (m *Middleware[TTx]) handlerFailed(w http.ResponseWriter, r *http.Request, k dedup.Key, err error, what string) {
	note(r, OutcomeFailed, err)
	var p *panicError
	switch {
	case errors.As(err, &p):
		if p.value == http.ErrAbortHandler {
			panic(http.ErrAbortHandler) // the handler asked to abort the response
		}
		m.log.ErrorContext(r.Context(), "httpidem: handler panicked", "scope", k.Scope, "key", k.ID, "panic", p.value, "stack", string(p.stack))
	case errors.Is(err, ErrResponseTooLarge):
		m.log.ErrorContext(r.Context(), "httpidem: response too large to store", "scope", k.Scope, "key", k.ID, "err", err)
		writeProblem(w, http.StatusInternalServerError, titleRespSize, err.Error()+". "+what, 0)
		return
	default:
		m.log.ErrorContext(r.Context(), "httpidem: handler failed", "scope", k.Scope, "key", k.ID, "err", err)
		if c := m.store.ClassifyError(err); c == dedup.ClassUnavailable || c == dedup.ClassConflict {
			note(r, OutcomeUnavailable, err)
			writeProblem(w, http.StatusServiceUnavailable, titleStore, what, time.Second)
			return
		}
	}
	writeProblem(w, http.StatusInternalServerError, titleFailed, what, 0)
}

// storeFailed answers a failure of the store itself: claiming, storing or
// committing. 409 is only for the store's word that the key itself is in
// flight (dedup.ErrInFlight); a busy database (dedup.ErrStoreBusy), or a
// collision with another transaction that names no key, is 503.
func (m *Middleware[TTx]) storeFailed(w http.ResponseWriter, r *http.Request, k dedup.Key, err error) {
	c := m.store.ClassifyError(err)
	note(r, OutcomeFailed, err)
	switch {
	case errors.Is(err, dedup.ErrStoreBusy):
		note(r, OutcomeStoreBusy, err)
		m.log.WarnContext(r.Context(), "httpidem: store busy", "scope", k.Scope, "key", k.ID, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, titleStoreBusy,
			"The idempotency store is busy with other requests. Retry with the same key: nothing was committed.", time.Second)
	case errors.Is(err, dedup.ErrInFlight):
		note(r, OutcomeInFlight, err)
		m.log.DebugContext(r.Context(), "httpidem: key in flight", "scope", k.Scope, "key", k.ID, "err", err)
		writeProblem(w, http.StatusConflict, titleBusy,
			"A request with the same Idempotency-Key is being processed; retry once it has finished.", time.Second)
	case c == dedup.ClassConflict:
		note(r, OutcomeStoreBusy, err)
		m.log.WarnContext(r.Context(), "httpidem: store conflict", "scope", k.Scope, "key", k.ID, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, titleStoreBusy,
			"The idempotency store's transaction collided with another. Retry with the same key: a retry replays the outcome, or runs the request if it did not commit.", time.Second)
	case c == dedup.ClassUnavailable:
		note(r, OutcomeUnavailable, err)
		m.log.ErrorContext(r.Context(), "httpidem: store unavailable", "scope", k.Scope, "key", k.ID, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, titleStore,
			"Retry with the same key: a retry replays the outcome, or runs the request if it did not commit.", time.Second)
	default:
		m.log.ErrorContext(r.Context(), "httpidem: store failed", "scope", k.Scope, "key", k.ID, "err", err)
		writeProblem(w, http.StatusInternalServerError, titleFailed,
			"The idempotency store failed. Retry with the same key: a retry replays the outcome, or runs the request if it did not commit.", 0)
	}
}

// serverError answers 500 for a failure that is not the client's.
func (m *Middleware[TTx]) serverError(w http.ResponseWriter, r *http.Request, what string, err error) {
	note(r, OutcomeFailed, err)
	m.log.ErrorContext(r.Context(), "httpidem: "+what, "method", r.Method, "path", r.URL.Path, "err", err)
	writeProblem(w, http.StatusInternalServerError, titleFailed,
		"The server could not process the request's Idempotency-Key; nothing was executed.", 0)
}
