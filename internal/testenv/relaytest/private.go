package relaytest

// Private servers for the tests that stop them: other packages' tests (and
// other people's runs) share the test environment's Postgres and RocketMQ,
// so these tests start their own on free ports (RocketMQ: rmqtest). (The shared Kafka has a
// machine-wide lock instead, testenv.KafkaExclusive, and is restarted
// through scripts/testenv/kafka.sh: see KafkaScript.)

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// repoPath returns a path from the repository's root.
func repoPath(elem ...string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(append([]string{filepath.Dir(file), "..", "..", ".."}, elem...)...)
}

// KafkaScript runs scripts/testenv/kafka.sh (kill, start, status). Only a
// test holding testenv.KafkaExclusive may kill the shared broker.
func KafkaScript(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command(repoPath("scripts", "testenv", "kafka.sh"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kafka.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// FreePort returns a port nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// PortFree reports whether nothing listens on port p.
func PortFree(p int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// Postgres is a throwaway, durable Postgres cluster: initdb into a temp
// dir, pg_ctl on a free port; as root it runs as the postgres user.
type Postgres struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	run  []string // runuser -u postgres --, or nothing
}

// StartPostgres initialises and starts a cluster, removed when the test
// ends.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	ver := os.Getenv("IDEM_PG_VERSION")
	if ver == "" {
		ver = "15"
	}
	bin := filepath.Join("/usr/lib/postgresql", ver, "bin")
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		t.Fatalf("no initdb in %s (scripts/testenv/postgres.sh installs it): %v", bin, err)
	}
	dir, err := os.MkdirTemp("", "idem-relay-pg-")
	if err != nil {
		t.Fatal(err)
	}
	p := &Postgres{t: t, bin: bin, dir: dir, port: FreePort(t)}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		p.run = []string{"runuser", "-u", "postgres", "--"}
	}
	t.Cleanup(func() {
		_ = p.ctl("stop", "-m", "immediate")
		os.RemoveAll(dir)
	})
	if out, err := p.cmd("initdb", "-D", p.data(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	// Durable: an immediate shutdown is a crash, and must lose nothing
	// that committed.
	conf := fmt.Sprintf("port = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = on\n"+
		"synchronous_commit = on\nfull_page_writes = on\nmax_connections = 100\n", p.port, dir)
	f, err := os.OpenFile(filepath.Join(p.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	return p
}

func (p *Postgres) data() string { return filepath.Join(p.dir, "data") }

// URL is the cluster's connection URL.
func (p *Postgres) URL() string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(p.port) + "/postgres?sslmode=disable"
}

func (p *Postgres) cmd(name string, args ...string) *exec.Cmd {
	argv := append(append([]string(nil), p.run...), append([]string{filepath.Join(p.bin, name)}, args...)...)
	c := exec.Command(argv[0], argv[1:]...)
	c.Dir = p.dir
	return c
}

func (p *Postgres) ctl(args ...string) error {
	args = append([]string{"-D", p.data(), "-w", "-t", "120"}, args...)
	out, err := p.cmd("pg_ctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Start starts the cluster and waits until it accepts connections.
func (p *Postgres) Start() {
	p.t.Helper()
	if err := p.ctl("-l", filepath.Join(p.dir, "log"), "start"); err != nil {
		p.t.Fatal(err)
	}
}

// Stop shuts the cluster down: "fast" rolls back the transactions in
// flight and closes the sessions; "immediate" quits at once (a crash) and
// recovers from the WAL on the next start.
func (p *Postgres) Stop(mode string) {
	p.t.Helper()
	if err := p.ctl("stop", "-m", mode); err != nil {
		p.t.Fatal(err)
	}
}
