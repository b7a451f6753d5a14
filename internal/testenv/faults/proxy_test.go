package faults_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// proxy is Toxiproxy (github.com/Shopify/toxiproxy/v2), embedded in-process
// (no server binary, no HTTP API) between the consumer and Postgres: a
// latency toxic delays what the client sends, and reset drops every live
// connection with a TCP RST on both sides. How, with Toxiproxy v2.12:
//
//   - Toxiproxy sets SO_LINGER 0 on a connection's two sockets only when the
//     connection starts with a reset_peer toxic in place; one added later
//     closes the existing connections with a FIN. So a reset_peer toxic sits
//     in every chain from the start with toxicity 0: it never fires, but
//     whenever Toxiproxy closes a connection it is abortive, a RST — also
//     when it passes on a hang-up of the other side.
//   - reset_peer fires only when data flows, and reset must also drop the
//     idle pooled connections. Removing a timeout toxic closes every
//     connection it was applied to (its Cleanup): reset adds one, removes it.
//     It does not say how many: Toxiproxy does not expose its connections.
//   - Toxiproxy's metrics count bytes, not connections: accepted counts its
//     "Accepted client" log events (a zerolog hook; the log itself goes
//     nowhere). The event comes before the upstream dial, so attempts while
//     Postgres is down count too.
type proxy struct {
	t        *testing.T
	px       *toxiproxy.Proxy
	latency  bool         // the latency toxic is in place
	accepted atomic.Int64 // connections Toxiproxy accepted
}

func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	p := &proxy{t: t}
	log := zerolog.New(io.Discard).Level(zerolog.InfoLevel).Hook(zerolog.HookFunc(
		func(_ *zerolog.Event, _ zerolog.Level, msg string) {
			if msg == "Accepted client" {
				p.accepted.Add(1)
			}
		}))
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), log)
	p.px = toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", upstream)
	p.addToxic(`{"name": "rst", "type": "reset_peer", "stream": "downstream", "toxicity": 0, "attributes": {"timeout": 0}}`)
	if err := p.px.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.px.Stop)
	return p
}

// addr is where the proxy listens (Start resolved port 0).
func (p *proxy) addr() string { return p.px.Listen }

func (p *proxy) addToxic(js string) {
	p.t.Helper()
	if _, err := p.px.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		p.t.Fatalf("toxiproxy: adding %s: %v", js, err)
	}
}

func (p *proxy) removeToxic(name string) {
	p.t.Helper()
	if err := p.px.Toxics.RemoveToxic(context.Background(), name); err != nil {
		p.t.Fatalf("toxiproxy: removing %s: %v", name, err)
	}
}

// setLatency delays each chunk the client sends by d (milliseconds, the
// toxic's unit); 0 removes the delay. (Replaced, not updated: updating a
// toxic writes its attributes while the connections' toxics read them.)
func (p *proxy) setLatency(d time.Duration) {
	p.t.Helper()
	if p.latency {
		p.removeToxic("latency")
		p.latency = false
	}
	if d > 0 {
		p.addToxic(fmt.Sprintf(`{"name": "latency", "type": "latency", "stream": "upstream", "attributes": {"latency": %d}}`, d.Milliseconds()))
		p.latency = true
	}
}

// reset drops every live connection, idle or not, with a TCP RST on both
// sides.
func (p *proxy) reset() {
	p.t.Helper()
	p.addToxic(`{"name": "cut", "type": "timeout", "stream": "downstream", "attributes": {"timeout": 0}}`)
	p.removeToxic("cut")
}

// toxiproxyLeaks are goroutines of a connection Toxiproxy leaves blocked for
// good, after Stop too: a toxic whose output nobody reads any more (the next
// toxic closed, as the timeout toxic's Cleanup does on reset, or the writer
// to the closed socket gave up) blocks on its next chunk, and the toxics and
// the reader before it on theirs. Toxiproxy never drains such a chain
// (Shopify/toxiproxy#428). Only Toxiproxy's frames: idem's leaks still count.
var toxiproxyLeaks = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).read"),
	goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).write"),
}
