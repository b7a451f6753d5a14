package rmqtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
)

// Private is a RocketMQ name server and broker of one test's own, from the
// jars scripts/testenv/rocketmq.sh downloaded, with the test environment's
// configuration (testdata/brokers/rocketmq) on free ports: for the tests
// that kill the broker while other packages' tests use the shared one.
type Private struct {
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
	_ = c.cmd.Process.Kill()
	<-c.exited
}

var brokerPorts atomic.Int64

// NewPrivate starts a name server and a broker, killed when the test ends.
func NewPrivate(t testing.TB) *Private {
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
	p := &Private{t: t, dir: dir, lib: lib, nsPort: testenv.FreePort(t)}
	// The broker listens on its port, port-2 (fast remoting) and port+1
	// (HA): all three must be free.
	for p.brPort == 0 {
		c := 20000 + int(brokerPorts.Add(1)*7+int64(os.Getpid())%5000)%20000
		if testenv.PortFree(c) && testenv.PortFree(c-2) && testenv.PortFree(c+1) && c != p.nsPort && c-2 != p.nsPort && c+1 != p.nsPort {
			p.brPort = c
		}
	}
	for _, d := range []string{"conf", "logs", "store"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_, file, _, _ := runtime.Caller(0)
	templates := filepath.Join(filepath.Dir(file), "..", "..", "..", "testdata", "brokers", "rocketmq")
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
func (p *Private) NameServers() []string {
	return []string{"127.0.0.1:" + strconv.Itoa(p.nsPort)}
}

// launch starts one server and waits for its boot line.
func (p *Private) launch(name, main, ready string, heap ...string) *proc {
	p.t.Helper()
	out := filepath.Join(p.dir, "logs", name+".out")
	args := append(heap,
		"-Duser.home="+p.dir, "-Drocketmq.home.dir="+p.dir,
		"-Drmq.logback.configurationFile="+filepath.Join(p.dir, "conf", "logback.xml"),
		"-Didem.rocketmq.logFile="+filepath.Join(p.dir, "logs", name+".log"),
		"-Drocketmq.namesrv.addr=127.0.0.1:"+strconv.Itoa(p.nsPort),
		"-Djava.net.preferIPv4Stack=true", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1",
		"-Dcom.rocketmq.remoting.client.closeSocketIfTimeout=false", // see common_jvm_opts in rocketmq_lib.sh
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
	testenv.DieWithParent(c)
	if err := c.Start(); err != nil {
		p.t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = c.Wait(); close(exited) }()
	testenv.WaitUntilProgress(p.t, 3*time.Minute, name+" boots", func() (bool, string) {
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
func (p *Private) StartBroker() {
	p.t.Helper()
	p.br = p.launch("broker", "org.apache.rocketmq.broker.BrokerStartup", "boot success",
		"-Xms256m", "-Xmx512m", "-XX:MaxDirectMemorySize=256m")
	testenv.WaitUntilProgress(p.t, 2*time.Minute, "the private broker registers with its name server", func() (bool, string) {
		_, _, err := ClusterBroker(p.NameServers()[0])
		return err == nil, fmt.Sprint(err)
	})
}

// KillBroker is a crash: SIGKILL; it returns once the broker's port is
// free.
func (p *Private) KillBroker() {
	p.br.kill()
	testenv.WaitUntil(p.t, time.Minute, "the killed broker's port is free", func() bool { return testenv.PortFree(p.brPort) })
}
