package testenv

// Private servers, for the tests that stop them: other packages' tests (and
// other people's runs) share the test environment's services, so a test that
// kills, restarts or pauses one starts its own on a free port:
// PrivatePostgres and PrivateKafka here, PrivateRedis (redis.go), and
// rmqtest.Private (apart, with the RocketMQ client). The shared
// Kafka has a machine-wide lock too, KafkaExclusive, for the tests that
// restart it through scripts/testenv/kafka.sh (Script); a test that
// restarts a broker for long (make soak) takes a PrivateKafka.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// FreePort returns a port of 127.0.0.1 nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// PortFree reports whether nothing listens on port p of 127.0.0.1.
func PortFree(p int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// PrivatePostgres is a throwaway, durable Postgres cluster: initdb into a
// temporary directory, pg_ctl on a free port; as root it runs as the
// postgres user (runuser). Durable, unlike the shared test cluster: an
// immediate shutdown is a crash, and with synchronous_commit or fsync off a
// crash loses transactions whose COMMIT already succeeded.
type PrivatePostgres struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	run  []string // runuser -u postgres --, or nothing
}

// NewPrivatePostgres initialises and starts a cluster, removed when the
// test ends. settings are postgresql.conf lines added to the defaults
// ("deadlock_timeout = 100ms"). The server is IDEM_PG_VERSION's (15 unset)
// from /usr/lib/postgresql, which scripts/testenv/postgres.sh installs.
func NewPrivatePostgres(t testing.TB, settings ...string) *PrivatePostgres {
	t.Helper()
	ver := os.Getenv("IDEM_PG_VERSION")
	if ver == "" {
		ver = "15"
	}
	bin := filepath.Join("/usr/lib/postgresql", ver, "bin")
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		t.Fatalf("no initdb in %s (scripts/testenv/postgres.sh installs it): %v", bin, err)
	}
	dir, err := os.MkdirTemp("", "idem-private-pg-")
	if err != nil {
		t.Fatal(err)
	}
	p := &PrivatePostgres{t: t, bin: bin, dir: dir, port: FreePort(t)}
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
	conf := fmt.Sprintf("port = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = on\n"+
		"synchronous_commit = on\nfull_page_writes = on\nmax_connections = 100\n", p.port, dir)
	for _, s := range settings {
		conf += s + "\n"
	}
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

func (p *PrivatePostgres) data() string { return filepath.Join(p.dir, "data") }

// Addr is the server's host:port.
func (p *PrivatePostgres) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// URL is the connection URL of the cluster's postgres database.
func (p *PrivatePostgres) URL() string { return p.URLVia(p.Addr()) }

// URLVia is URL through addr instead of the server's own (a proxy's).
func (p *PrivatePostgres) URLVia(addr string) string {
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable"
}

func (p *PrivatePostgres) cmd(name string, args ...string) *exec.Cmd {
	argv := append(append([]string(nil), p.run...), append([]string{filepath.Join(p.bin, name)}, args...)...)
	c := exec.Command(argv[0], argv[1:]...)
	c.Dir = p.dir
	return c
}

func (p *PrivatePostgres) ctl(args ...string) error {
	args = append([]string{"-D", p.data(), "-w", "-t", "120"}, args...)
	out, err := p.cmd("pg_ctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Start starts the cluster and waits until it accepts connections.
func (p *PrivatePostgres) Start() {
	p.t.Helper()
	if err := p.ctl("-l", filepath.Join(p.dir, "log"), "start"); err != nil {
		p.t.Fatal(err)
	}
}

// Stop shuts the cluster down: "fast" rolls back the transactions in
// flight and closes the sessions; "immediate" quits at once (a crash) and
// recovers from the WAL on the next start.
func (p *PrivatePostgres) Stop(mode string) {
	p.t.Helper()
	if err := p.ctl("stop", "-m", mode); err != nil {
		p.t.Fatal(err)
	}
}

// PrivateKafka is a throwaway single-node Kafka (KRaft) on free ports with
// its own data directory, run by scripts/testenv/kafka-private.sh from the
// jars kafka.sh downloads.
type PrivateKafka struct {
	t    testing.TB
	dir  string
	port int
}

// NewPrivateKafka formats and starts a broker, removed when the test ends.
func NewPrivateKafka(t testing.TB) *PrivateKafka {
	t.Helper()
	dir, err := os.MkdirTemp("", "idem-private-kafka-")
	if err != nil {
		t.Fatal(err)
	}
	k := &PrivateKafka{t: t, dir: dir, port: FreePort(t)}
	ctl := FreePort(t)
	for ctl == k.port {
		ctl = FreePort(t)
	}
	t.Cleanup(func() {
		_, _ = RunScript("kafka-private", "kill", dir)
		os.RemoveAll(dir)
	})
	Script(t, "kafka-private", "up", dir, strconv.Itoa(k.port), strconv.Itoa(ctl))
	return k
}

// Brokers is the broker's address, for a client's broker list.
func (k *PrivateKafka) Brokers() []string { return []string{"127.0.0.1:" + strconv.Itoa(k.port)} }

// Kill is a crash of the broker: SIGKILL; its data stays for Start.
func (k *PrivateKafka) Kill() {
	k.t.Helper()
	Script(k.t, "kafka-private", "kill", k.dir)
}

// Start starts the broker again on its data and waits until it is ready.
func (k *PrivateKafka) Start() {
	k.t.Helper()
	Script(k.t, "kafka-private", "start", k.dir)
}
