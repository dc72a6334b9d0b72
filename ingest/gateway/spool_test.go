package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestGatewaySpools: with a SpoolDir, the gateway's own refusal of a
// call goes to the posts spool and a refusal report to the reports
// spool, each a file when sent; a second gateway on the same directory
// does not start; what Close could not deliver stays in the spool.
func TestGatewaySpools(t *testing.T) {
	reg, err := enforce.NewRegistry([]byte(`{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "fs",
  "tools": [{"tool_name": "read", "tool_class": "read", "is_document_op": false}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// NATS without the Talos streams: nothing is acknowledged.
	nc, err := nats.Connect(testenv.NATSForTest(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	dir := filepath.Join(t.TempDir(), "spool")
	o := Options{EPID: "gw-spool", Registry: reg, SpoolDir: dir, Logger: slog.New(slog.DiscardHandler)}
	g, err := New(o, nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	pre, err := g.envelope(context.Background(), &Principal{}, "s-1", &pending{server: "fs", name: "read", args: json.RawMessage(`{"path":"a"}`)})
	if err != nil {
		t.Fatal(err)
	}
	g.fail(&Principal{}, pre, schemas.CodeEnforcementUnavailable, "no connection to Talos", false)
	report, err := ep.NewCall("gw-spool", schemas.ServerUnauthenticated, "tools/call", map[string]any{"reason": "missing_token"})
	if err != nil {
		t.Fatal(err)
	}
	g.refused.Send(report)

	spooled := func(sub string) []string {
		files, err := filepath.Glob(filepath.Join(dir, sub, "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	for sub, id := range map[string]string{SpoolPosts: pre.ToolCallID, SpoolReports: report.ToolCallID} {
		files := spooled(sub)
		if len(files) != 1 {
			t.Fatalf("%s spool holds %v, want one file", sub, files)
		}
		b, err := os.ReadFile(files[0])
		if err != nil {
			t.Fatal(err)
		}
		var c schemas.ToolCall
		if err := json.Unmarshal(b, &c); err != nil || c.ToolCallID != id {
			t.Fatalf("%s spool file holds %s (%v), want %s", sub, b, err, id)
		}
	}
	if got := g.out.Full(); got {
		t.Fatal("a spooled post event: Full")
	}
	if _, err := New(o, nc, nil); !errors.Is(err, ep.ErrSpoolInUse) {
		t.Fatalf("a second gateway on the spool: %v, want ErrSpoolInUse", err)
	}
	g.Close(0)
	if len(spooled(SpoolPosts)) != 1 || len(spooled(SpoolReports)) != 1 {
		t.Fatal("Close removed undelivered events from the spool")
	}
}
