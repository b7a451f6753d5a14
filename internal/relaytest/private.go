package relaytest

// Private servers for the tests that stop them: other packages' tests (and
// other people's runs) share the test environment's Postgres and RocketMQ,
// so these tests start their own on free ports. (The shared Kafka has a
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
	"syscall"
	"testing"
	"time"
)

// repoPath returns a path from the repository's root.
func repoPath(elem ...string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(append([]string{filepath.Dir(file), "..", ".."}, elem...)...)
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

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func portFree(p int) bool {
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
	p := &Postgres{t: t, bin: bin, dir: dir, port: freePort(t)}
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

// PrivateRocketMQ is a RocketMQ name server and broker of the test's own,
// from the jars scripts/testenv/rocketmq.sh downloaded, with the test
// environment's configuration on free ports.
type PrivateRocketMQ struct {
	t      testing.TB
	dir    string
	lib    string
	nsPort int
	brPort int
	ns, br *proc
}

// proc is a server process and a channel closed when it exited.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

func (c *proc) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exited
}

// StartRocketMQ starts a name server and a broker, killed when the test
// ends.
func StartRocketMQ(t testing.TB) *PrivateRocketMQ {
	t.Helper()
	ver := os.Getenv("IDEM_ROCKETMQ_VERSION")
	if ver == "" {
		ver = "5.3.3"
	}
	cache := os.Getenv("IDEM_CACHE_DIR")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "idem")
	}
	lib := filepath.Join(cache, "rocketmq-"+ver, "lib")
	if _, err := os.Stat(filepath.Join(lib, "rocketmq-broker-"+ver+".jar")); err != nil {
		t.Fatalf("RocketMQ jars missing in %s (scripts/testenv/rocketmq.sh up downloads them): %v", lib, err)
	}
	dir := t.TempDir()
	p := &PrivateRocketMQ{t: t, dir: dir, lib: lib, nsPort: freePort(t)}
	for p.brPort == 0 {
		c := 20000 + int(uniq.Add(1)*7+int64(os.Getpid())%5000)%20000
		if portFree(c) && portFree(c-2) && portFree(c+1) && c != p.nsPort && c-2 != p.nsPort && c+1 != p.nsPort {
			p.brPort = c
		}
	}
	for _, d := range []string{"conf", "logs", "store"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	templates := repoPath("testdata", "brokers", "rocketmq")
	render := func(name string, repl ...string) {
		b, err := os.ReadFile(filepath.Join(templates, name))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.NewReplacer(append([]string{"@STATE_DIR@", dir}, repl...)...).Replace(string(b))
		if err := os.WriteFile(filepath.Join(dir, "conf", name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ns := "127.0.0.1:" + strconv.Itoa(p.nsPort)
	render("namesrv.conf", "listenPort=9876", "listenPort="+strconv.Itoa(p.nsPort))
	render("broker.conf", "listenPort=10911", "listenPort="+strconv.Itoa(p.brPort), "namesrvAddr=127.0.0.1:9876", "namesrvAddr="+ns)
	render("logback.xml")
	t.Cleanup(func() {
		for _, c := range []*proc{p.br, p.ns} {
			if c != nil {
				c.kill()
			}
		}
	})
	p.ns = p.launch("namesrv", "org.apache.rocketmq.namesrv.NamesrvStartup", "The Name Server boot success", "-Xms128m", "-Xmx256m")
	p.StartBroker()
	return p
}

// NameServers is the private name server's address.
func (p *PrivateRocketMQ) NameServers() []string { return []string{"127.0.0.1:" + strconv.Itoa(p.nsPort)} }

// launch starts one server and waits for its boot line.
func (p *PrivateRocketMQ) launch(name, main, ready string, heap ...string) *proc {
	p.t.Helper()
	out := filepath.Join(p.dir, "logs", name+".out")
	args := append(heap,
		"-Duser.home="+p.dir, "-Drocketmq.home.dir="+p.dir,
		"-Drmq.logback.configurationFile="+filepath.Join(p.dir, "conf", "logback.xml"),
		"-Didem.rocketmq.logFile="+filepath.Join(p.dir, "logs", name+".log"),
		"-Drocketmq.namesrv.addr=127.0.0.1:"+strconv.Itoa(p.nsPort),
		"-Djava.net.preferIPv4Stack=true", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1",
		"-cp", filepath.Join(p.lib, "*"), main, "-c", filepath.Join(p.dir, "conf", name+".conf"))
	f, err := os.Create(out)
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	java := "java"
	if h := os.Getenv("JAVA_HOME"); h != "" {
		java = filepath.Join(h, "bin", "java")
	}
	c := exec.Command(java, args...)
	c.Dir, c.Stdout, c.Stderr = p.dir, f, f
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		p.t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = c.Wait(); close(exited) }()
	WaitFor(p.t, 3*time.Minute, name+" boots", func() (bool, string) {
		b, _ := os.ReadFile(out)
		if strings.Contains(string(b), ready) {
			return true, ""
		}
		select {
		case <-exited:
			p.t.Fatalf("%s exited:\n%s", name, b)
		default:
		}
		s := string(b)
		if len(s) > 500 {
			s = "..." + s[len(s)-500:]
		}
		return false, s
	})
	return &proc{cmd: c, exited: exited}
}

// StartBroker starts the broker on its store and waits until the name
// server routes to it.
func (p *PrivateRocketMQ) StartBroker() {
	p.t.Helper()
	p.br = p.launch("broker", "org.apache.rocketmq.broker.BrokerStartup", "boot success",
		"-Xms256m", "-Xmx512m", "-XX:MaxDirectMemorySize=256m")
	WaitFor(p.t, 2*time.Minute, "the private broker registers with its name server", func() (bool, string) {
		_, _, err := clusterBroker(p.NameServers()[0])
		return err == nil, fmt.Sprint(err)
	})
}

// KillBroker is a crash: SIGKILL.
func (p *PrivateRocketMQ) KillBroker() {
	p.br.kill()
	WaitFor(p.t, time.Minute, "the killed broker's port is free", func() (bool, string) { return portFree(p.brPort), "" })
}
