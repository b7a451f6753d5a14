package testenv

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestComposeMatchesTestEnvironment checks that docker-compose.yml offers
// every service of scripts/testenv.sh on the port the test environment uses,
// bound to 127.0.0.1, so one set of IDEM_TEST_* variables works with both.
func TestComposeMatchesTestEnvironment(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image string   `yaml:"image"`
			Ports []string `yaml:"ports"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	out, err := exec.Command("../../scripts/testenv.sh", "env").Output()
	if err != nil {
		t.Fatalf("scripts/testenv.sh env: %v", err)
	}
	// export IDEM_TEST_PG_URL='postgres://postgres@127.0.0.1:5432/...'
	ports := map[string]string{}
	for _, m := range regexp.MustCompile(`(IDEM_TEST_\w+)='?[^\n]*?127\.0\.0\.1:(\d+)`).FindAllStringSubmatch(string(out), -1) {
		ports[m[1]] = m[2]
	}
	want := []struct{ service, env, image string }{
		{"postgres", "IDEM_TEST_PG_URL", "postgres:15"},
		{"kafka", "IDEM_TEST_KAFKA_BROKERS", "apache/kafka:4.1"},
		{"rocketmq-namesrv", "IDEM_TEST_ROCKETMQ_NAMESRV", "apache/rocketmq:5.3"},
		{"rocketmq-broker", "", "apache/rocketmq:5.3"},
		{"mysql", "IDEM_TEST_MYSQL_DSN", "mysql:8"},
		{"redis", "IDEM_TEST_REDIS_ADDR", "redis:7"},
	}
	for _, w := range want {
		svc, ok := compose.Services[w.service]
		if !ok {
			t.Errorf("docker-compose.yml has no service %q", w.service)
			continue
		}
		if !strings.HasPrefix(svc.Image, w.image) {
			t.Errorf("%s: image %q, want %s.x", w.service, svc.Image, w.image)
		}
		port := "10911" // the broker's port, advertised by the name server
		if w.env != "" {
			port = ports[w.env]
			if port == "" {
				t.Errorf("scripts/testenv.sh env prints no 127.0.0.1 port for %s", w.env)
				continue
			}
		}
		published := false
		for _, p := range svc.Ports {
			if p == "127.0.0.1:"+port+":"+port {
				published = true
			}
		}
		if !published {
			t.Errorf("%s does not publish 127.0.0.1:%s:%s (ports %v)", w.service, port, port, svc.Ports)
		}
	}
}
