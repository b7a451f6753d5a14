package main

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consumer/wire"
	"github.com/idemkit/idem/dedup"
	"github.com/idemkit/idem/internal/testenv"
)

// hostile are strings an attacker puts in a key, a reason or a letter's
// headers: a window title (OSC 0), an erased line and a forged one, a
// clipboard write (OSC 52), a C1 CSI, DEL and a right-to-left override.
var hostile = []string{
	"k-title\x1b]0;pwned\x07",
	"k-erase\x1b[2K\r\nFAKE released everything",
	"k-clip\x1b]52;c;cHduZWQ=\x07",
	"k-c1\u009b31mred",
	"k-del\x7f\u202eevil",
}

// assertInert fails when out holds a control character but newline, or a
// line forged by a hostile string.
func assertInert(t *testing.T, what, out string) {
	t.Helper()
	for i, r := range out {
		if r == utf8.RuneError || r != '\n' && unsafeRune(r) {
			t.Errorf("%s: %U at byte %d: %q", what, r, i, out[max(0, i-20):min(len(out), i+20)])
			return
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "FAKE") {
			t.Errorf("%s: a forged line %q in\n%s", what, line, out)
		}
	}
}

func fp(s string) []byte { f := dedup.FingerprintOf([]byte(s)); return f[:] }

var tags = regexp.MustCompile(`<[^>]*>`)

// pageText is a page's text as a browser shows it: no tags, entities read.
func pageText(body string) string { return html.UnescapeString(tags.ReplaceAllString(body, "")) }

// TestHostileStringsComeOutInert seeds hostile keys, reasons and sources in
// Postgres and a hostile letter in a real Kafka dead-letter topic, and
// checks the bytes of status, failed, show, release and redrive, and the
// text of the console's pages and dry runs: every control character comes
// out escaped, and no line is forged.
func TestHostileStringsComeOutInert(t *testing.T) {
	f := newConsoleFixture(t)
	ctx := testenv.Context(t, 2*time.Minute)
	for _, k := range hostile {
		if _, err := f.pool.Exec(ctx, `INSERT INTO idem_dedup (scope, key, fingerprint, outcome, reason, source) VALUES ('pay', $1, $2, 'failed', $3, $4)`,
			k, fp(k), "reason "+k, "source "+k); err != nil {
			t.Fatal(err)
		}
	}
	// A hostile scope, oldest key of its own.
	if _, err := f.pool.Exec(ctx, `INSERT INTO idem_dedup (scope, key, fingerprint, outcome) VALUES ($1, $2, $3, 'done')`,
		hostile[0], hostile[1], fp("")); err != nil {
		t.Fatal(err)
	}
	dlq := f.dlq + ".hostile"
	cl := &kafkago.Client{Addr: kafkago.TCP(f.brokers...), Timeout: 30 * time.Second, Transport: f.tr}
	if _, err := cl.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{{Topic: dlq, NumPartitions: 1, ReplicationFactor: 1}}}); err != nil {
		t.Fatal(err)
	}
	w := &kafkago.Writer{Addr: kafkago.TCP(f.brokers...), Topic: dlq, RequiredAcks: kafkago.RequireAll, BatchTimeout: time.Millisecond, Transport: f.tr, AllowAutoTopicCreation: true}
	defer w.Close()
	h := func(k, v string) kafkago.Header { return kafkago.Header{Key: k, Value: []byte(v)} }
	if err := w.WriteMessages(ctx, kafkago.Message{Key: []byte("x"), Value: []byte("{}"), Headers: []kafkago.Header{
		h(wire.MetaTopic, hostile[2]), h(wire.MetaPartition, "0"), h(wire.MetaKeyScope, hostile[3]),
		h(wire.MetaKey, hostile[1]), h(wire.MetaCause, hostile[4]), h(wire.MetaReason, hostile[0]),
	}}); err != nil {
		t.Fatal(err)
	}

	runs := [][]string{
		{"status"},
		{"failed"},
		{"show", hostile[1]},
		{"show", "--scope", "pay", hostile[0]},
		append([]string{"release", "--scope", "pay", "--dry-run", "missing\x1b]0;x\x07"}, hostile...),
		{"redrive", "--topic", dlq, "--dry-run"},
	}
	for _, args := range runs {
		code, out, errOut := idem(t, "", f.envs, args...)
		if code != exitOK && code != exitPartial {
			t.Errorf("%q: exit %d\n%s", args, code, errOut)
		}
		assertInert(t, "idem "+args[0]+" stdout", out)
		assertInert(t, "idem "+args[0]+" stderr", errOut)
		if args[0] != "redrive" && args[0] != "status" && !strings.Contains(out, `k-title\x1b]0;pwned\x07`) {
			t.Errorf("idem %s does not show the key escaped:\n%s", args[0], out)
		}
	}
	// Released for real, with the confirmation's question too.
	code, out, errOut := idem(t, "y\n", f.envs, append([]string{"release", "--scope", "pay"}, hostile...)...)
	assertInert(t, "idem release stdout", out)
	assertInert(t, "idem release stderr", errOut)
	if code != exitOK || strings.Count(out, "released pay k-") != len(hostile) {
		t.Errorf("release of the hostile keys: exit %d\n%s", code, out)
	}
	for _, k := range hostile {
		if _, err := f.pool.Exec(ctx, `INSERT INTO idem_dedup (scope, key, fingerprint, outcome, reason, source) VALUES ('pay', $1, $2, 'failed', $3, $4)`,
			k, fp(k), "reason "+k, "source "+k); err != nil {
			t.Fatal(err)
		}
	}

	f.console.topic = dlq
	release := "/release?scope=pay"
	for _, k := range hostile {
		release += "&key=" + url.QueryEscape(k)
	}
	for _, target := range []string{"/", "/failed", release, "/letters", "/redrive"} {
		code, body := f.do(t, http.MethodGet, target, nil, nil)
		if code != http.StatusOK {
			t.Errorf("GET %s: %d", target, code)
		}
		assertInert(t, "GET "+target, pageText(body))
	}
}
