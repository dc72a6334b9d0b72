package registrylint

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/schemas"
)

// noEnum finds no action enum anywhere.
func noEnum(any, string) ([]string, bool) { return nil, false }

// Lint counts every kind (zero included) and fails only on errors; the
// skeleton holds the MISSING tools with their suggested class and parses
// as a manifest.
func TestLintAndSkeleton(t *testing.T) {
	m := &schemas.Manifest{ServerID: "svc", Tools: []schemas.Tool{{ToolName: "gone", ToolClass: "read"}}}
	live := []*mcp.Tool{{Name: "new_read", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, {Name: "new_write"}}
	var rep Report
	Lint(&rep, m, live, noEnum)
	if rep.OK || rep.LiveTools != 2 || rep.RegistryTools != 1 || len(rep.Counts) != len(kinds) ||
		rep.Counts[Missing] != 2 || rep.Counts[Stale] != 1 || rep.Counts[Advisory] != 0 {
		t.Fatalf("report %+v", rep)
	}
	b, err := Skeleton("svc", "1.0", rep.Findings)
	if err != nil {
		t.Fatal(err)
	}
	sk, err := schemas.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(sk.Tools) != 2 || sk.Tools[0].ToolName != "new_read" || sk.Tools[0].ToolClass != schemas.ClassRead ||
		sk.Tools[1].ToolClass != schemas.ClassWrite || sk.ServerVersion != "1.0" {
		t.Fatalf("skeleton %s", b)
	}

	// Only warnings: OK.
	rep = Report{}
	Lint(&rep, m, nil, noEnum)
	if !rep.OK || rep.Counts[Stale] != 1 {
		t.Fatalf("stale only: %+v", rep)
	}
	if got := Printable("a\x1b[2Jb"); !strings.HasPrefix(got, `"`) || Printable("ok_name") != "ok_name" {
		t.Fatalf("Printable: %s", got)
	}
}
