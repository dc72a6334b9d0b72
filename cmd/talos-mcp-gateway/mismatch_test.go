package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestRegistryMismatchSaid: a gateway whose --registry is not the one
// Talos enforces has every call denied REGISTRY_VERSION_MISMATCH, and
// says so once, naming both digests and what to do.
func TestRegistryMismatchSaid(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	own := filepath.Join(registryDir, "everything.json")
	cmd := testenv.Command(s.gateway, "--nats-url", s.natsURL(), "--nats-auth", "none", "--registry", own,
		"--trusted-keys", filepath.Join(s.dir, "worker.pub"), "--ep-id", "gw-mismatch",
		"--upstream", "everything="+testenv.MCPBin(t, "mcp-server-everything"))
	gw := s.connectGateway(ctx, cmd)
	for range 2 {
		gw.call(ctx, "echo", map[string]any{"message": "x"}).mustDeny(t, "echo", schemas.CodeRegistryVersionMismatch)
	}
	ownReg, err := enforce.LoadRegistry(own)
	if err != nil {
		t.Fatal(err)
	}
	enforced, err := enforce.LoadRegistry(s.registry)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(gw.log)
	var said []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Talos enforces another registry than this gateway's --registry") {
			said = append(said, l)
		}
	}
	if len(said) != 1 {
		t.Fatalf("the mismatch was logged %d times, want once:\n%s", len(said), strings.Join(said, "\n"))
	}
	for _, want := range []string{"gateway_registry_digest=" + ownReg.Digest(), "enforced_registry_digest=" + enforced.Digest(), "talosctl registry show"} {
		if !strings.Contains(said[0], want) {
			t.Errorf("the mismatch line lacks %q:\n%s", want, said[0])
		}
	}
}
