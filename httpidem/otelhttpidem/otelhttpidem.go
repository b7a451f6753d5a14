package otelhttpidem

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/httpidem"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/idemkit/idem/httpidem/otelhttpidem"

// Attributes of idem's own, beside the HTTP conventions'.
const (
	AttrOutcome  = attribute.Key("idem.http.outcome")    // httpidem.Outcome
	AttrLeaseOp  = attribute.Key("idem.lease.operation") // finish, extend, end
	AttrKeyScope = attribute.Key("idem.key.scope")       // the key's scope: method, route, tenant
	AttrKey      = attribute.Key("idem.key")             // the Idempotency-Key
	AttrTakeover = attribute.Key("idem.lease.takeover")  // the lease was taken over
)

// AgeBuckets are the bucket bounds of idem.http.replay.age, in seconds:
// those of the consumer's duplicate ages (1s, 10s, 1m, 10m, 1h, 6h, 1d,
// 7d, 30d, 90d).
var AgeBuckets = []float64{1, 10, 60, 600, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400, 90 * 86400}

// Config configures a Telemetry. Zero values take the defaults.
type Config struct {
	// Routes are the routes whose counters start at zero, as "METHOD
	// route" ("POST /payments/{id}/capture"): the method and the route's
	// name, as a key's scope begins. Others appear with their first
	// request.
	Routes []string
	// MeterProvider and TracerProvider default to the global ones (otel's
	// no-ops until the application installs an SDK).
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
	// Propagator reads the client's trace context from the request's
	// headers when no span is in the request's context; default W3C Trace
	// Context.
	Propagator propagation.TextMapPropagator
}

// Telemetry is an httpidem.Observer that records OpenTelemetry metrics
// and spans. One serves every route of a Middleware. Safe for concurrent
// use.
type Telemetry struct {
	cfg    Config
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	routes [][2]string // Config.Routes: method, route

	requests  metric.Int64Counter
	age       metric.Float64Histogram
	takeovers metric.Int64Counter
	fenced    metric.Int64Counter
}

// New returns a Telemetry; set it as httpidem.Config.Observer.
func New(cfg Config) (*Telemetry, error) {
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = propagation.TraceContext{}
	}
	t := &Telemetry{cfg: cfg, tracer: cfg.TracerProvider.Tracer(ScopeName), prop: cfg.Propagator}
	var errs []error
	for _, r := range cfg.Routes {
		method, route, ok := strings.Cut(r, " ")
		if !ok || method == "" || route == "" || strings.ContainsAny(route, " #") {
			errs = append(errs, fmt.Errorf("otelhttpidem: Config.Routes: %q: want \"METHOD route\"", r))
			continue
		}
		t.routes = append(t.routes, [2]string{method, route})
	}
	m := cfg.MeterProvider.Meter(ScopeName)
	var err error
	t.requests, err = m.Int64Counter("idem.http.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Requests of idempotent routes, by how the middleware answered them (idem.http.outcome)."))
	errs = append(errs, err)
	t.age, err = m.Float64Histogram("idem.http.replay.age", metric.WithUnit("s"),
		metric.WithDescription("How long after its key's first request a retry was answered with the stored response: retention must stay above its 99.9th percentile."),
		metric.WithExplicitBucketBoundaries(AgeBuckets...))
	errs = append(errs, err)
	t.takeovers, err = m.Int64Counter("idem.http.lease.takeovers", metric.WithUnit("{request}"),
		metric.WithDescription("Leases taken over from an earlier holder that left no outcome (it crashed, answered 5xx, or was released)."))
	errs = append(errs, err)
	t.fenced, err = m.Int64Counter("idem.http.lease.fenced", metric.WithUnit("{write}"),
		metric.WithDescription("Lease writes the store refused because the lease was taken over or released (idem.lease.operation)."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	t.Zero()
	return t, nil
}

// Zero adds 0 to every counter of Config.Routes and of routes (each
// "METHOD route"), for every outcome and lease operation: a scrape lists
// them before their first request. New calls it for Config.Routes.
func (t *Telemetry) Zero(routes ...string) {
	ctx := context.Background()
	all := t.routes
	for _, r := range routes {
		if method, route, ok := strings.Cut(r, " "); ok {
			all = append(all, [2]string{method, route})
		}
	}
	for _, r := range all {
		base := routeAttrs(r[0], r[1])
		for _, o := range httpidem.Outcomes() {
			t.requests.Add(ctx, 0, with(base, AttrOutcome.String(o.String())))
		}
		t.takeovers.Add(ctx, 0, with(base))
		for _, op := range leaseOps {
			t.fenced.Add(ctx, 0, with(base, AttrLeaseOp.String(op)))
		}
	}
}

var leaseOps = []string{"finish", "extend", "end"}

func routeAttrs(method, route string) []attribute.KeyValue {
	return []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(method), semconv.HTTPRoute(route)}
}

func with(base []attribute.KeyValue, kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(append(base[:len(base):len(base)], kv...)...))
}

// scopeRoute is the method and route of a key's scope ("METHOD route#tenant").
func scopeRoute(scope string) (method, route string) {
	scope, _, _ = strings.Cut(scope, "#")
	method, route, _ = strings.Cut(scope, " ")
	return method, route
}

// RequestStart starts the request's span: a SERVER span under the
// headers' trace context, or an INTERNAL child of a span the request's
// context holds already.
func (t *Telemetry) RequestStart(ctx context.Context, r httpidem.RequestInfo) context.Context {
	name := r.Method
	if r.Route != "" {
		name += " " + r.Route
	}
	attrs := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(r.Method)}
	if r.Route != "" {
		attrs = append(attrs, semconv.HTTPRoute(r.Route))
	}
	if trace.SpanContextFromContext(ctx).IsValid() {
		ctx, _ = t.tracer.Start(ctx, "idem "+name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
		return ctx
	}
	if r.Request != nil {
		ctx = t.prop.Extract(ctx, propagation.HeaderCarrier(r.Request.Header))
		if r.Request.URL != nil {
			attrs = append(attrs, semconv.URLPath(r.Request.URL.Path))
		}
	}
	ctx, _ = t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return ctx
}

// RequestEnd counts the request, records a replay's age and a takeover,
// and ends the request's span.
func (t *Telemetry) RequestEnd(ctx context.Context, e httpidem.RequestEvent) {
	base := routeAttrs(e.Method, e.Route)
	t.requests.Add(ctx, 1, with(base, AttrOutcome.String(e.Outcome.String())))
	if e.Outcome == httpidem.OutcomeReplayed && !e.FirstAt.IsZero() {
		t.age.Record(ctx, e.Age.Seconds(), with(base))
	}
	if e.Takeover {
		t.takeovers.Add(ctx, 1, with(base))
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrOutcome.String(e.Outcome.String()))
	if e.Status != 0 {
		span.SetAttributes(semconv.HTTPResponseStatusCode(e.Status))
	}
	if e.Key != (dedup.Key{}) {
		span.SetAttributes(AttrKeyScope.String(e.Key.Scope), AttrKey.String(e.Key.ID))
	}
	if e.Takeover {
		span.SetAttributes(AttrTakeover.Bool(true))
	}
	switch e.Outcome {
	case httpidem.OutcomeFailed, httpidem.OutcomeUnavailable, httpidem.OutcomeStoreBusy:
		span.SetAttributes(semconv.ErrorTypeKey.String(e.Outcome.String()))
		desc := e.Outcome.String()
		if e.Err != nil {
			span.RecordError(e.Err)
			desc = e.Err.Error()
		}
		span.SetStatus(codes.Error, desc)
	}
	span.End()
}

// LeaseFenced counts a lease write the store refused, and adds an event
// to the request's span.
func (t *Telemetry) LeaseFenced(ctx context.Context, k dedup.Key, op string) {
	method, route := scopeRoute(k.Scope)
	t.fenced.Add(ctx, 1, with(routeAttrs(method, route), AttrLeaseOp.String(op)))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("idem lease fenced", trace.WithAttributes(AttrLeaseOp.String(op)))
	}
}

// StuckCounter counts stuck requests: dedup.RequestStore's
// CountStuckRequests (*pgstore.Store, *sqlitestore.Store).
type StuckCounter interface {
	CountStuckRequests(ctx context.Context) (map[string]int64, error)
}

// ObserveStore adds the gauge idem.http.requests.stuck: the store's
// Processing keys whose lease ran out (crashed holders, uncertain outcomes
// no request has retried), by method and route, summed over tenants, read
// from the store at every collection; 0 for Config.Routes without any.
// Release them with the store's ReleaseRequest (`idem status` lists them
// by scope). Unregister the registration when the store is gone.
func (t *Telemetry) ObserveStore(st StuckCounter) (metric.Registration, error) {
	if st == nil {
		return nil, errors.New("otelhttpidem: ObserveStore of a nil store")
	}
	m := t.cfg.MeterProvider.Meter(ScopeName)
	stuck, err := m.Int64ObservableGauge("idem.http.requests.stuck", metric.WithUnit("{request}"),
		metric.WithDescription("Processing keys whose lease ran out: a crashed holder or an uncertain outcome no request has retried."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		counts, err := st.CountStuckRequests(ctx)
		if err != nil {
			return err
		}
		byRoute := map[[2]string]int64{}
		for _, r := range t.routes {
			byRoute[r] = 0
		}
		for scope, n := range counts {
			method, route := scopeRoute(scope)
			byRoute[[2]string{method, route}] += n
		}
		for r, n := range byRoute {
			o.ObserveInt64(stuck, n, with(routeAttrs(r[0], r[1])))
		}
		return nil
	}, stuck)
}

var _ httpidem.Observer = (*Telemetry)(nil)
