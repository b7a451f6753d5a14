package httpidem

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/idemkit/idem/dedup"
)

// Config configures a Middleware. Zero values take the defaults.
type Config[TTx any] struct {
	// Store keeps the keys and their request records: *pgstore.Store or
	// *sqlitestore.Store, migrated. Required.
	Store dedup.RequestStore[TTx]
	// Tenant, when set, names whom a request acts for — the authenticated
	// account — and becomes part of its keys' scope, so that two tenants
	// may use one key without seeing each other's responses. Take it from
	// what authentication established, never from something the client
	// chooses freely. An error is answered 500 (run authentication before
	// this middleware). Default: no tenant, one key space per route.
	Tenant func(r *http.Request) (string, error)
	// Logger receives the middleware's logs (handler errors, panics, store
	// failures); default slog.Default(). Request bodies are never logged.
	Logger *slog.Logger
	// Observer sees each request's outcome (httpidem/otelhttpidem records
	// them as OpenTelemetry metrics and spans); default none.
	Observer Observer
}

// Route configures one endpoint. Zero values take the defaults.
type Route struct {
	// Name is the route in the keys' scope, beside the request's method:
	// the pattern ("/payments/{id}/capture"), not the path, so that a key
	// names one operation. Default: the pattern http.ServeMux matched
	// (Request.Pattern, without its method and host). At most 64 bytes, no
	// '#' and no control characters.
	Name string
	// Header carries the key; default "Idempotency-Key". Its value is taken
	// as it stands or, quoted, as a Structured Fields string (the IETF
	// draft's form): `"abc"` and `abc` are the key abc. 1 to 256 bytes of
	// UTF-8 without control characters; anything else is answered 400,
	// never truncated.
	Header string
	// Key, when set, takes the request's key from the request and its
	// body instead of Header: for a caller that sends no key header, such
	// as a payment channel whose callback carries its identity in the body
	// (Alipay's trade_no and trade_status). The body is read (within
	// MaxRequestBytes) before Key runs. Its key is checked as a header's
	// is; an error, or an empty or invalid key, is answered 400 and claims
	// nothing. Not with Optional or Header. Default: none (the header).
	Key func(r *http.Request, body []byte) (string, error)
	// Optional lets requests without a key through, without idempotency;
	// default false: a request without one is answered 400, as the IETF
	// draft asks of an operation that requires the key.
	Optional bool
	// Fingerprint says what "the same request" is under one key; default
	// WholeBody. The method, the route and the path values are always part
	// of it (see IgnorePathValues). A retry with another fingerprint is
	// answered 422.
	Fingerprint FingerprintFunc
	// IgnorePathValues leaves the path's wildcard values out of the
	// request's identity. By default they are in it: on
	// "POST /payments/{id}/capture" a key used for payment 1 and then for
	// payment 2 is answered 422 (the key was used for another request, as
	// the IETF draft and Stripe answer), never with payment 1's response.
	// With IgnorePathValues the key names the operation whatever the path
	// says, and the second request gets the first one's response: set it
	// only where no wildcard chooses what the handler acts on. The values
	// are those of the http.ServeMux pattern that matched (Request.Pattern,
	// Request.PathValue); another router's path parameters are not seen —
	// put them into Fingerprint.
	IgnorePathValues bool
	// Retention is how long a key and its response are kept, from the
	// first request; default 24h (Stripe's). Negative: for ever. Purge
	// (the store's, in bounded batches) deletes them afterwards, never
	// while a lease on the key runs: a lease extended past the retention
	// keeps its key.
	Retention time.Duration
	// Lease is how long a leased request holds its key before another may
	// take it over; default 30s. A handler that needs longer extends it
	// (Lease.Extend). Leased routes only.
	Lease time.Duration
	// MaxRequestBytes bounds the request body; default 1 MiB. A larger one
	// is answered 413 before any store work.
	MaxRequestBytes int64
	// MaxResponseBytes bounds the response body the middleware buffers and
	// stores; default 1 MiB. See ErrResponseTooLarge for what a larger one
	// gets.
	MaxResponseBytes int
	// StoredHeaders names response header fields stored and replayed
	// besides DefaultStoredHeaders.
	StoredHeaders []string
	// Entity, when set, names the entity a request is an event of — a
	// trade, a payment intent — and the event's version, read from the
	// request and its body: a payment channel's callbacks about one trade,
	// each under a key of its own, then move the trade only forward. In the
	// transaction that runs the request under its key, right after the
	// claim, the event meets its entity's watermark (dedup.Watermarks, in
	// the route's key scope): above it, the watermark becomes its version
	// and the handler runs; at or below it (equal included) the request is
	// stale: the handler does not run, the store records it
	// (dedup.Watermarks.StaleEvents, idem stale) and Stale answers it. The
	// watermark, the key and the response commit together; a retry of a
	// stale request replays its answer. A zero Entity.Name: the request is
	// of no entity. An error (dedup.ErrUnknownStatus from a
	// dedup.StatusRank, a body that does not parse) is answered 400 and
	// claims nothing. Transactional routes with a required key only (from
	// Header, or from the body with Key), on a
	// store that keeps watermarks (pgstore, sqlitestore); Transactional
	// panics otherwise. Default: none.
	Entity func(r *http.Request, body []byte) (Entity, error)
	// Stale answers a stale request (see Entity) in the request's
	// transaction; what it writes is stored with the key as a handler's
	// response is (StoredHeaders, and Idempotent-Stale). Default
	// AnswerStale: 200 with Idempotent-Stale: true and a JSON body naming
	// the entity and both versions.
	Stale func(w http.ResponseWriter, r *http.Request, s StaleRequest)
}

// DefaultStoredHeaders are the response header fields a replay repeats:
// those that describe the response's content and the resource it created.
// Others (Set-Cookie, Date, tracing headers) go out with the first response
// only.
var DefaultStoredHeaders = []string{
	"Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Content-Location",
	"Content-Type", "ETag", "Expires", "Last-Modified", "Link", "Location", "Retry-After", "Vary",
}

// Defaults of Route.
const (
	DefaultHeader           = "Idempotency-Key"
	DefaultRetention        = 24 * time.Hour
	DefaultLease            = 30 * time.Second
	DefaultMaxRequestBytes  = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
	// MaxRouteLen bounds Route.Name.
	MaxRouteLen = 64
)

// route is a Route with its defaults applied.
type route struct {
	Route
	stored map[string]bool
}

func (rt Route) resolve(leased bool) (*route, error) {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("httpidem: Route."+format, args...))
	}
	if rt.Name != "" {
		if err := validRoute(rt.Name); err != nil {
			add("Name %q: %v", rt.Name, err)
		}
	}
	switch {
	case rt.Key != nil && rt.Header != "":
		add("Key and Header are both set; the key comes from one of them")
	case rt.Key != nil && rt.Optional:
		add("Key is set with Optional: a key taken from the request is required")
	}
	if rt.Header == "" {
		rt.Header = DefaultHeader
	}
	rt.Header = http.CanonicalHeaderKey(rt.Header)
	if rt.Fingerprint == nil {
		rt.Fingerprint = WholeBody()
	}
	switch {
	case rt.Retention == 0:
		rt.Retention = DefaultRetention
	case rt.Retention < 0:
		rt.Retention = 0 // for ever, as the stores take it
	}
	if rt.Lease < 0 {
		add("Lease is negative")
	} else if rt.Lease == 0 {
		rt.Lease = DefaultLease
	}
	if leased && rt.Retention > 0 && rt.Retention < rt.Lease {
		add("Retention %v is shorter than Lease %v: a key would be purged while held", rt.Retention, rt.Lease)
	}
	if rt.MaxRequestBytes < 0 || rt.MaxResponseBytes < 0 {
		add("MaxRequestBytes and MaxResponseBytes must not be negative")
	}
	if rt.MaxRequestBytes == 0 {
		rt.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if rt.MaxResponseBytes == 0 {
		rt.MaxResponseBytes = DefaultMaxResponseBytes
	}
	switch {
	case rt.Entity == nil && rt.Stale != nil:
		add("Stale is set without Entity: no request can be stale")
	case rt.Entity != nil && leased:
		add("Entity is for Transactional routes: a Leased route commits its key before the handler runs, and a watermark moved then would stay moved for a request whose outcome is unknown")
	case rt.Entity != nil && rt.Optional:
		add("Entity needs a key on every request (Optional is set): the watermark moves in the transaction of the key's claim")
	case rt.Entity != nil && rt.Stale == nil:
		rt.Stale = AnswerStale
	}
	stored := make(map[string]bool, len(DefaultStoredHeaders)+len(rt.StoredHeaders))
	for _, h := range DefaultStoredHeaders {
		stored[http.CanonicalHeaderKey(h)] = true
	}
	for _, h := range rt.StoredHeaders {
		stored[http.CanonicalHeaderKey(h)] = true
	}
	if rt.Entity != nil {
		stored[HeaderStale] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &route{Route: rt, stored: stored}, nil
}

// validRoute checks a route name: it must keep the scope unambiguous
// (method, space, route, '#', tenant) and short enough for a tenant.
func validRoute(name string) error {
	switch {
	case name == "":
		return errors.New("empty")
	case len(name) > MaxRouteLen:
		return fmt.Errorf("%d bytes, the limit is %d", len(name), MaxRouteLen)
	case strings.Contains(name, "#"):
		return errors.New("contains '#', which separates the tenant in a scope")
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("has control character %U", r)
		}
	}
	return nil
}

// name returns the route name of r: the configured one, or the pattern
// ServeMux matched without its method and host.
func (rt *route) name(r *http.Request) (string, error) {
	if rt.Name != "" {
		return rt.Name, nil
	}
	p := r.Pattern
	if i := strings.IndexAny(p, " \t"); i >= 0 {
		p = strings.TrimLeft(p[i:], " \t")
	}
	if i := strings.IndexByte(p, '/'); i > 0 {
		p = p[i:] // a host pattern: "example.com/x"
	}
	if p == "" {
		return "", errors.New("httpidem: Route.Name is empty and no http.ServeMux pattern matched the request: name the route")
	}
	if err := validRoute(p); err != nil {
		return "", fmt.Errorf("httpidem: route %q from the ServeMux pattern: %v: set Route.Name", p, err)
	}
	return p, nil
}
