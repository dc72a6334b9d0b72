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
		env[m[1]] = strings.Trim(m[2], `"`)
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

func TestChainPrefix(t *testing.T) {
	for in, want := range map[string]string{"worker1": "worker1", "_Ops.Host-7_": "ops-host-7", "...": "talosd", "ÄÖ node": "node"} {
		if got := chainPrefix(in); got != want {
			t.Errorf("chainPrefix(%q) = %q, want %q", in, got, want)
		}
	}
}
