package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talos-audit/talos/ingest/ep"
)

// TestPrepareAndSigner: Prepare makes the issuer's and the agent's keys
// once and a fresh capability every time; Signer signs as the demo agent
// with it, and is nil where there is no capability.
func TestPrepareAndSigner(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	if s, err := Signer(dir); s != nil || err != nil {
		t.Fatalf("no capability yet: signer %v, %v", s, err)
	}
	if err := Prepare(dir); err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(filepath.Join(dir, Agent+".key"))
	capability, _ := os.ReadFile(filepath.Join(dir, CapabilityFile))
	if err := Prepare(dir); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, Agent+".key")); len(key) == 0 || !bytes.Equal(again, key) {
		t.Fatal("the demo agent's key was replaced")
	}
	if again, _ := os.ReadFile(filepath.Join(dir, CapabilityFile)); bytes.Equal(again, capability) {
		t.Fatal("the capability was not issued anew")
	}
	s, err := Signer(dir)
	if err != nil || s == nil || s.Holder() != Agent {
		t.Fatalf("signer: %v, %v", s, err)
	}
	call, err := ep.NewCall(EP, "files", "read_file", map[string]any{"path": "README.md"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sign(call); err != nil {
		t.Fatal(err)
	}
}

// TestCases: every case says what it shows, once, and names a server; the
// raw envelope takes its tool_call_id and names the demo enforcement point.
func TestCases(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range Cases() {
		if c.What == "" || seen[c.What] || c.Server == "" {
			t.Errorf("case %+v: empty or repeated", c)
		}
		seen[c.What] = true
		if c.raw != nil && (!bytes.Contains(c.raw, []byte(`"tool_call_id":"%s"`)) || !strings.Contains(string(c.raw), `"ep_id":"`+EP+`"`)) {
			t.Errorf("raw case %q: %s", c.What, c.raw)
		}
		if c.raw == nil && c.Tool == "" {
			t.Errorf("case %q names no tool", c.What)
		}
	}
	if len(seen) < 10 {
		t.Fatalf("%d cases", len(seen))
	}
}
