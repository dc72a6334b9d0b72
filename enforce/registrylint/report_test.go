package registrylint

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/schemas"
)

// LoadManifest finds the server's manifest in a registry directory and
// notes the digest; a server without one, or no registry, gets an empty
// manifest.
func TestLoadManifest(t *testing.T) {
	dir := filepath.Join("..", "testdata", "registry")
	rep := Report{ServerID: "files", Registry: dir}
	m, err := rep.LoadManifest()
	if err != nil || !rep.ManifestFound || !strings.HasPrefix(rep.RegistryDigest, "sha256:") || len(m.Tools) == 0 || m.ServerID != "files" {
		t.Fatalf("svc: %+v, %+v, %v", m, rep, err)
	}
	rep = Report{ServerID: "other", Registry: dir}
	if m, err = rep.LoadManifest(); err != nil || rep.ManifestFound || rep.RegistryDigest == "" || m.ServerID != "other" || len(m.Tools) != 0 {
		t.Fatalf("other: %+v, %+v, %v", m, rep, err)
	}
	rep = Report{ServerID: "svc"}
	if m, err = rep.LoadManifest(); err != nil || rep.ManifestFound || rep.RegistryDigest != "" || len(m.Tools) != 0 {
		t.Fatalf("no registry: %+v, %+v, %v", m, rep, err)
	}
	rep = Report{ServerID: "svc", Registry: filepath.Join(dir, "none")}
	if _, err = rep.LoadManifest(); err == nil {
		t.Fatal("a missing registry loaded")
	}
}

// WriteSkeleton creates the file once, never over an existing one, and
// the text report names it; without a skeleton it says none was needed.
func TestWriteSkeletonAndText(t *testing.T) {
	m := &schemas.Manifest{ServerID: "svc", Tools: []schemas.Tool{{ToolName: "gone", ToolClass: "read"}}}
	rep := Report{ServerID: "svc", ServerName: "srv", ServerVersion: "1.0"}
	Lint(&rep, m, []*mcp.Tool{{Name: "new\x1b"}}, noEnum)
	path := filepath.Join(t.TempDir(), "skeleton.json")
	if err := rep.WriteSkeleton(path); err != nil || rep.Skeleton != path {
		t.Fatalf("WriteSkeleton: %v (%q)", err, rep.Skeleton)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := schemas.ParseManifest(b); err != nil {
		t.Fatalf("skeleton: %v\n%s", err, b)
	}
	if err := rep.WriteSkeleton(path); err == nil {
		t.Fatal("WriteSkeleton overwrote its file")
	}
	var out bytes.Buffer
	if err := rep.WriteText(&out, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`MISSING  svc/"new\x1b"  -`, "STALE    svc/gone", "lint svc (srv 1.0): 1 tools on the server, 1 in the registry: 1 missing, 0 missing actions, 0 drifted, 0 invalid, 1 stale",
		": FAIL\n", "wrote a skeleton with 1 tools, 0 prompts and 0 resources to " + path,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	rep = Report{ServerID: "svc"}
	Lint(&rep, m, nil, noEnum)
	out.Reset()
	if err := rep.WriteText(&out, true); err != nil || !strings.HasSuffix(out.String(), ": ok\nnothing missing: no skeleton written\n") {
		t.Fatalf("nothing missing: %v\n%s", err, out.String())
	}
}
