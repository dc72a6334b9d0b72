package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// TestComposeMatchesFlags keeps docker-compose.yml honest without a Docker
// engine: every TALOS_* variable it sets must be the environment variable
// of a talosd flag, and the values it gives to enum flags must parse.
func TestComposeMatchesFlags(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c cli
	parser, err := kong.New(&c, kong.DefaultEnvars("TALOS"), kong.Bind(&c.Flags))
	if err != nil {
		t.Fatal(err)
	}
	envs := map[string]bool{}
	for _, f := range parser.Model.Flags {
		for _, e := range f.Envs {
			envs[e] = true
		}
	}
	if !envs["TALOS_NATS_URL"] || !envs["TALOS_SIGNING_KEY"] {
		t.Fatalf("flag model lacks the DESIGN.md variables: %v", envs)
	}
	set := regexp.MustCompile(`(?m)^\s+(TALOS_[A-Z_]+):\s*(.*)$`).FindAllStringSubmatch(string(raw), -1)
	if len(set) < 8 {
		t.Fatalf("found only %d TALOS_* settings in docker-compose.yml", len(set))
	}
	// The talosctl tools service may also set talosctl's own variables.
	tools := ""
	if i := strings.Index(string(raw), "\n  talosctl:\n"); i >= 0 {
		tools = string(raw)[i:]
		if j := strings.Index(tools, "\nvolumes:"); j >= 0 {
			tools = tools[:j]
		}
	}
	talosctlOnly := map[string]bool{"TALOS_RESPONDER_KEY": true}
	env := map[string]string{}
	for _, m := range set {
		if talosctlOnly[m[1]] {
			if !strings.Contains(tools, m[0]) {
				t.Errorf("docker-compose.yml sets talosctl's %s outside the talosctl service", m[1])
			}
			continue
		}
		if !envs[m[1]] {
			t.Errorf("docker-compose.yml sets %s, which is no talosd flag", m[1])
		}
		// The first setting of a variable is the shared x-talosd one;
		// services override some (the web service's TALOS_ROLES).
		if _, seen := env[m[1]]; !seen {
			env[m[1]] = strings.Trim(m[2], `"`)
		}
	}
	if !strings.Contains(string(raw), "TALOS_ROLES: web\n") {
		t.Error("docker-compose.yml has no dashboard service (TALOS_ROLES: web)")
	}
	// The values parse as talosd would read them.
	for k, v := range env {
		t.Setenv(k, v)
	}
	if _, err := parser.Parse([]string{"run"}); err != nil {
		t.Fatalf("talosd rejects the compose environment: %v", err)
	}
	if c.Mode != "prod" || strings.Join(c.Roles, ",") != "enforce,sink,control" || len(c.ResponderKeys) != 1 || c.Replicas != 3 {
		t.Fatalf("compose environment parsed as mode %q roles %v replicas %d", c.Mode, c.Roles, c.Replicas)
	}
}

// TestComposeGrafana keeps the grafana service of docker-compose.yml in
// step with deploy/grafana: the plugin the provisioned data source needs,
// the directories it mounts (which must exist), the home dashboard, and
// the ClickHouse service and port the data source points at.
func TestComposeGrafana(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	svc := composeService(t, string(raw), "grafana")
	for _, want := range []string{
		"image: grafana/grafana:",
		"GF_INSTALL_PLUGINS: grafana-clickhouse-datasource",
		"clickhouse: { condition: service_healthy }",
		`ports: ["3000:3000"]`,
	} {
		if !strings.Contains(svc, want) {
			t.Errorf("grafana service lacks %q:\n%s", want, svc)
		}
	}
	mounts := regexp.MustCompile(`(?m)^\s+- \./(deploy/grafana/[a-z/]+):(/\S+?)(:ro)?$`).FindAllStringSubmatch(svc, -1)
	targets := map[string]string{}
	for _, m := range mounts {
		if st, err := os.Stat("../../" + m[1]); err != nil || !st.IsDir() {
			t.Errorf("grafana mounts ./%s, which is not a directory of the repository (%v)", m[1], err)
		}
		targets[m[2]] = m[1]
	}
	if targets["/etc/grafana/provisioning"] != "deploy/grafana/provisioning" || targets["/var/lib/grafana/dashboards"] != "deploy/grafana/dashboards" {
		t.Errorf("grafana mounts %v; want deploy/grafana/provisioning and deploy/grafana/dashboards", targets)
	}
	home := regexp.MustCompile(`GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH: /var/lib/grafana/dashboards/(\S+)`).FindStringSubmatch(svc)
	if home == nil {
		t.Error("grafana has no home dashboard")
	} else if _, err := os.Stat("../../deploy/grafana/dashboards/" + home[1]); err != nil {
		t.Errorf("home dashboard: %v", err)
	}
	ds, err := os.ReadFile("../../deploy/grafana/provisioning/datasources/talos-clickhouse.yaml")
	if err != nil {
		t.Fatal(err)
	}
	host := regexp.MustCompile(`(?m)^\s+host: (\S+)$`).FindStringSubmatch(string(ds))
	port := regexp.MustCompile(`(?m)^\s+port: (\d+)$`).FindStringSubmatch(string(ds))
	if host == nil || port == nil {
		t.Fatalf("the data source names no host or port:\n%s", ds)
	}
	ch := composeService(t, string(raw), host[1])
	if !strings.Contains(ch, `"`+port[1]+":"+port[1]+`"`) {
		t.Errorf("the data source uses %s:%s, which the %s service does not serve:\n%s", host[1], port[1], host[1], ch)
	}
	if !strings.Contains(string(ds), "defaultDatabase: talos") || !strings.Contains(string(raw), "TALOS_CLICKHOUSE_DATABASE: talos") {
		t.Error("the data source and talosd use different databases")
	}
}

// composeService returns the text of one top-level service of
// docker-compose.yml (up to the next service or top-level key).
func composeService(t *testing.T, compose, name string) string {
	t.Helper()
	i := strings.Index(compose, "\n  "+name+":\n")
	if i < 0 {
		t.Fatalf("docker-compose.yml has no %s service", name)
	}
	rest := compose[i+1:]
	if j := regexp.MustCompile(`\n(  [a-z0-9_-]+:\n|[a-z]+:)`).FindStringIndex(rest[1:]); j != nil {
		rest = rest[:j[0]+1]
	}
	return rest
}
