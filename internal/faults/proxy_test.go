package faults_test

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxy is an in-process TCP proxy between the consumer and Postgres that
// adds latency and resets connections (TCP RST), the two network faults
// the suite needs. (Toxiproxy offers these and more; embedding it would add
// a web framework, Prometheus and zerolog to go.mod and move versions the
// RocketMQ client depends on, for ~100 lines.)
type proxy struct {
	ln       net.Listener
	upstream string
	latency  atomic.Int64 // nanoseconds added before each chunk the client sends
	accepted atomic.Int64 // connections accepted

	mu    sync.Mutex
	conns map[net.Conn]net.Conn // client -> upstream
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: upstream, conns: map[net.Conn]net.Conn{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		u, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
		if err != nil {
			c.Close() // upstream down: the client sees the connection close
			continue
		}
		p.mu.Lock()
		p.conns[c] = u
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, u, true)
		go p.pipe(u, c, false)
	}
}

// pipe copies from src to dst; from the client it waits the latency first.
func (p *proxy) pipe(src, dst net.Conn, fromClient bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(p.latency.Load()); fromClient && d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			if err != io.EOF {
				src.Close()
			}
			dst.Close()
			if fromClient {
				p.mu.Lock()
				delete(p.conns, src)
				p.mu.Unlock()
			}
			return
		}
	}
}

func (p *proxy) setLatency(d time.Duration) { p.latency.Store(int64(d)) }

// reset cuts every connection with a TCP RST on both sides (reset_peer).
func (p *proxy) reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c, u := range p.conns {
		for _, x := range []net.Conn{c, u} {
			if tc, ok := x.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			x.Close()
		}
		delete(p.conns, c)
		n++
	}
	return n
}

func (p *proxy) close() {
	p.ln.Close()
	p.reset()
	p.wg.Wait()
}
