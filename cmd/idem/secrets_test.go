package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
)

// The secrets a hostile environment holds; none may be printed.
const (
	pgPassword      = "pg-Pa55word-never-shown"
	consoleSecret   = "console-token-never-shown-0123456789"
	metricsPassword = "metrics-Pa55word-never-shown"
)

var secretEnv = map[string]string{
	"IDEM_PG_URL":        "postgres://idem:" + pgPassword + "@127.0.0.1:1/idem",
	"IDEM_CONSOLE_TOKEN": consoleSecret,
	"IDEM_METRICS_URL":   "http://scraper:" + metricsPassword + "@127.0.0.1:1/metrics",
}

func assertNoSecret(t *testing.T, what string, outs ...string) {
	t.Helper()
	for _, out := range outs {
		for _, s := range []string{pgPassword, consoleSecret, metricsPassword} {
			if strings.Contains(out, s) {
				t.Errorf("%s prints the secret %q:\n%s", what, s, out)
			}
		}
	}
}

// TestHelpAndUsageErrorsPrintNoSecret: every command's --help, an unknown
// flag, a bad value and a secret typed into the wrong flag print no secret
// of the environment or the arguments; --help says where the value comes
// from instead.
func TestHelpAndUsageErrorsPrintNoSecret(t *testing.T) {
	for _, c := range commands() {
		for _, args := range [][]string{
			{c.name, "--help"},
			{c.name, "--no-such-flag"},
			{c.name, "--json=" + consoleSecret},
			{c.name, "--no-such-flag=" + pgPassword},
		} {
			code, out, errOut := idem(t, "", secretEnv, args...)
			assertNoSecret(t, strings.Join(args, " "), out, errOut)
			if args[1] == "--help" {
				if code != exitOK || strings.Contains(errOut, "-pg ") && !strings.Contains(errOut, "from $IDEM_PG_URL") {
					t.Errorf("%s --help: exit %d, no \"from $IDEM_PG_URL\":\n%s", c.name, code, errOut)
				}
			} else if code != exitUsage {
				t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
			}
		}
	}
	// A flag given the secret on the command line is warned about, not echoed.
	_, out, errOut := idem(t, "", nil, "status", "--pg", secretEnv["IDEM_PG_URL"])
	assertNoSecret(t, "status --pg URL", out, errOut)
	if !strings.Contains(errOut, "ps") || !strings.Contains(errOut, "--pg-file") {
		t.Errorf("--pg as an argument: no warning:\n%s", errOut)
	}
	// A URL without credentials is no secret: no warning.
	if _, _, errOut := idem(t, "", nil, "retention", "--metrics", "http://127.0.0.1:1/metrics"); strings.Contains(errOut, "warning") {
		t.Errorf("--metrics without credentials warned:\n%s", errOut)
	}
}

// TestPgFile: --pg-file reads the Postgres URL from a file, the way to
// give it without the environment or the process's arguments.
func TestPgFile(t *testing.T) {
	pgURL := testenv.PostgresURL(t)
	_, schema := testenv.SchemaPool(t)
	path := filepath.Join(t.TempDir(), "pg")
	if err := os.WriteFile(path, []byte(pgURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	envs := map[string]string{"IDEM_PG_SCHEMA": schema}
	if code, out, _ := idem(t, "", envs, "migrate", "--pg-file", path); code != exitOK || !strings.Contains(out, "migrated") {
		t.Errorf("migrate --pg-file: exit %d %q", code, out)
	}
	if code, _, errOut := idem(t, "", envs, "status", "--pg-file", filepath.Join(t.TempDir(), "missing")); code != exitUsage || !strings.Contains(errOut, "-pg-file") {
		t.Errorf("status --pg-file of a missing file: exit %d %q", code, errOut)
	}
}

// TestMetricsURLRedacted: the metrics URL's password is not shown when the
// endpoint answers non-200, cannot be reached, or the URL is malformed; in
// idem retention nor on the console's overview.
func TestMetricsURLRedacted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusForbidden)
	}))
	defer srv.Close()
	for _, u := range []string{
		strings.Replace(srv.URL, "http://", "http://scraper:"+metricsPassword+"@", 1) + "/metrics?token=" + metricsPassword,
		"http://scraper:" + metricsPassword + "@127.0.0.1:1/metrics",
		"http://scraper:" + metricsPassword + "@127.0.0.1:bad port/metrics",
		"://scraper:" + metricsPassword + "@",
	} {
		_, err := scrape(t.Context(), u)
		if err == nil {
			t.Fatalf("scrape %s: no error", u)
		}
		assertNoSecret(t, "scrape's error", err.Error())
	}
	f := newConsoleFixture(t)
	f.console.metrics = strings.Replace(srv.URL, "http://", "http://scraper:"+metricsPassword+"@", 1) + "/metrics"
	code, body := f.do(t, http.MethodGet, "/", nil, nil)
	assertNoSecret(t, "the overview", body)
	if code != http.StatusOK || !strings.Contains(body, "403") {
		t.Errorf("the overview with a failing metrics endpoint: %d\n%s", code, body)
	}
	envs := map[string]string{"IDEM_METRICS_URL": f.console.metrics}
	for k, v := range f.envs {
		envs[k] = v
	}
	_, out, errOut := idem(t, "", envs, "retention")
	assertNoSecret(t, "idem retention", out, errOut)
}
