package schemas

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A chain file is read strictly: an unknown member is refused before
// decoding; MarshalFile is indented with a final newline.
func TestCapabilityChainFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadCapabilityChainFile(filepath.Join(dir, "none.json")); !os.IsNotExist(err) {
		t.Fatalf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"capability":{},"extra":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCapabilityChainFile(bad); err == nil {
		t.Fatal("a chain with an unknown member was read")
	}
	c := &CapabilityChain{Capability: Capability{CapabilityID: "cap-1"}}
	b, err := c.MarshalFile()
	if err != nil || !strings.HasPrefix(string(b), "{\n  \"capability\": {") || !strings.HasSuffix(string(b), "}\n") {
		t.Fatalf("MarshalFile = %s, %v", b, err)
	}
}
