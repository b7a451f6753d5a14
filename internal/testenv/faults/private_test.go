package faults_test

// Private servers for the scenarios that stop them: other test packages run
// in parallel against the shared Postgres and RocketMQ, so these scenarios
// start their own on free ports. (Kafka has a lock every test takes,
// testenv.KafkaExclusive, and is restarted through scripts/testenv/kafka.sh.)

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/internal/testenv/rmqtest"
)

// freePort returns a port nothing listens on now.
func freePort(t *testing.T) int {
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

// --- Postgres ---------------------------------------------------------------

// privatePG is a throwaway Postgres cluster: initdb into a temp dir, pg_ctl
// on a free port. As root it runs as the postgres user (runuser).
type privatePG struct {
	t    *testing.T
	bin  string
	dir  string
	port int
	run  []string // prefix: runuser -u postgres --, or nothing
}

func startPrivatePG(t *testing.T) *privatePG {
	t.Helper()
	ver := os.Getenv("IDEM_PG_VERSION")
	if ver == "" {
		ver = "15"
	}
	bin := filepath.Join("/usr/lib/postgresql", ver, "bin")
	if _, err := os.Stat(filepath.Join(bin, "initdb")); err != nil {
		t.Fatalf("no initdb in %s (scripts/testenv/postgres.sh installs it): %v", bin, err)
	}
	dir, err := os.MkdirTemp("", "idem-faults-pg-")
	if err != nil {
		t.Fatal(err)
	}
	p := &privatePG{t: t, bin: bin, dir: dir, port: freePort(t)}
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
	// Durable, unlike the shared test cluster: an immediate shutdown is a
	// crash, and with synchronous_commit or fsync off a crash loses
	// transactions whose COMMIT already succeeded — messages the consumer
	// rightly acknowledged. (This suite caught exactly that before the
	// settings below.)
	conf := fmt.Sprintf("port = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = on\n"+
		"synchronous_commit = on\nfull_page_writes = on\nmax_connections = 100\ndeadlock_timeout = 100ms\n", p.port, dir)
	f, err := os.OpenFile(filepath.Join(p.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	p.start()
	return p
}

func (p *privatePG) data() string { return filepath.Join(p.dir, "data") }
func (p *privatePG) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// url is the connection URL through addr (the server's, or a proxy's).
func (p *privatePG) url(addr string) string {
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable"
}

func (p *privatePG) cmd(name string, args ...string) *exec.Cmd {
	argv := append(append([]string(nil), p.run...), append([]string{filepath.Join(p.bin, name)}, args...)...)
	c := exec.Command(argv[0], argv[1:]...)
	c.Dir = p.dir
	return c
}

func (p *privatePG) ctl(args ...string) error {
	args = append([]string{"-D", p.data(), "-w", "-t", "60"}, args...)
	out, err := p.cmd("pg_ctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (p *privatePG) start() {
	p.t.Helper()
	if err := p.ctl("-l", filepath.Join(p.dir, "log"), "start"); err != nil {
		p.t.Fatal(err)
	}
}

// stop shuts the server down: "fast" rolls back the transactions in flight
// and closes the sessions; "immediate" quits at once and recovers from the
// WAL on the next start.
func (p *privatePG) stop(mode string) {
	p.t.Helper()
	if err := p.ctl("stop", "-m", mode); err != nil {
		p.t.Fatal(err)
	}
}

// --- RocketMQ ------------------------------------------------------------------

// privateRocket is a RocketMQ name server and broker of its own, from the
// jars scripts/testenv/rocketmq.sh downloaded, with the test environment's
// configuration on free ports.
type privateRocket struct {
	t      *testing.T
	dir    string
	lib    string
	nsPort int
	brPort int
	ns, br *exec.Cmd
	*rocketBroker
}

func startPrivateRocket(t *testing.T) *privateRocket {
	t.Helper()
	testenv := filepath.Join(scriptPath(""), "..", "..", "testdata", "brokers", "rocketmq")
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
	p := &privateRocket{t: t, dir: dir, lib: lib, nsPort: freePort(t)}
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
	render := func(name string, repl ...string) {
		b, err := os.ReadFile(filepath.Join(testenv, name))
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
		for _, c := range []*exec.Cmd{p.br, p.ns} {
			if c != nil && c.ProcessState == nil {
				_ = c.Process.Kill()
				_ = c.Wait()
			}
		}
		if p.rocketBroker != nil {
			p.rocketBroker.close()
		}
	})
	p.ns = p.launch("namesrv", "org.apache.rocketmq.namesrv.NamesrvStartup", "The Name Server boot success", "-Xms128m", "-Xmx256m")
	p.startBroker()
	return p
}

// launch starts one server and waits for its boot line.
func (p *privateRocket) launch(name, main, ready string, heap ...string) *exec.Cmd {
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
	testenv.WaitUntilProgress(p.t, 2*time.Minute, name+" boots", func() (bool, string) {
		b, _ := os.ReadFile(out)
		if strings.Contains(string(b), ready) {
			return true, ""
		}
		if c.ProcessState != nil {
			p.t.Fatalf("%s exited:\n%s", name, b)
		}
		return false, tail(string(b), 500)
	})
	return c
}

// startBroker starts the broker on its store and waits until the name
// server routes to it.
func (p *privateRocket) startBroker() {
	p.t.Helper()
	p.br = p.launch("broker", "org.apache.rocketmq.broker.BrokerStartup", "boot success",
		"-Xms256m", "-Xmx512m", "-XX:MaxDirectMemorySize=256m")
	ns := []string{"127.0.0.1:" + strconv.Itoa(p.nsPort)}
	testenv.WaitUntilProgress(p.t, 2*time.Minute, "the private broker registers with its name server", func() (bool, string) {
		_, _, err := rmqtest.ClusterBroker(ns[0])
		return err == nil, fmt.Sprint(err)
	})
	if p.rocketBroker == nil {
		b, err := connectRocket(ns)
		if err != nil {
			p.t.Fatal(err)
		}
		p.rocketBroker = b
	}
}

// killBroker is a crash: SIGKILL.
func (p *privateRocket) killBroker() {
	_ = p.br.Process.Signal(syscall.SIGKILL)
	_ = p.br.Wait()
}
