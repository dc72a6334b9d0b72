package gateway

import (
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
)

// TestReportDrift: a tool whose live definition drifted from its pin is
// reported to Talos once per live hash (a pre envelope for the tool in
// the drift session, carrying the live hash, that the worker denies
// DENY_TOOL_DRIFT) and counted; the same hash again is not, a new one is;
// a tool that matches its pin, or has none, is not; a definition that
// cannot be hashed is counted but not sent (the worker could not tell).
func TestReportDrift(t *testing.T) {
	pin, hashA, hashB := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)
	reg, err := enforce.NewRegistry([]byte(`{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "rug",
  "tools": [
    {"tool_name": "greet", "tool_class": "read", "is_document_op": false, "trust_level": "internal", "definition_sha256": "` + pin + `"},
    {"tool_name": "rug", "tool_class": "read", "is_document_op": false, "trust_level": "internal"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	out := &sent{}
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"server_id", "tool"})
	g := &Gateway{o: Options{EPID: "gw-1", Registry: reg}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		driftRef: counter, drifted: map[string]bool{}, driftOut: out}
	list := func(greet string) map[string]upstreamTool {
		return map[string]upstreamTool{
			"greet": {server: "rug", tool: &mcp.Tool{Name: "greet"}, def: greet},
			"rug":   {server: "rug", tool: &mcp.Tool{Name: "rug"}, def: hashB},
		}
	}
	counted := func() float64 { return testutil.ToFloat64(counter.WithLabelValues("rug", "greet")) }

	g.reportDrift(list(pin))
	if len(out.calls) != 0 || counted() != 0 {
		t.Fatalf("pinned definitions reported: %d sent, %v counted", len(out.calls), counted())
	}
	g.reportDrift(list(hashA))
	g.reportDrift(list(hashA))
	if len(out.calls) != 1 || counted() != 1 {
		t.Fatalf("one drift to %s: %d sent, %v counted, want 1", hashA, len(out.calls), counted())
	}
	env := out.calls[0]
	if env.ServerID != "rug" || env.ToolName != "greet" || env.Phase != schemas.PhasePre || env.SessionID != "tool-drift-gw-1" ||
		env.ToolDefinitionSHA256 != hashA || env.Actor.AgentID != "" || env.RequestHash == "" || env.RegistryDigest != reg.Digest() {
		t.Fatalf("report envelope %+v", env)
	}
	var args map[string]string
	if err := json.Unmarshal(env.Request.Arguments, &args); err != nil {
		t.Fatal(err)
	}
	if args["reason"] != "definition drift" || args["pinned"] != pin || args["live"] != hashA || len(args) != 3 {
		t.Fatalf("report arguments %v", args)
	}
	raw, _ := json.Marshal(env)
	pc, err := schemas.ParseToolCall(raw, schemas.Limits{})
	if err != nil {
		t.Fatalf("the report is not a valid envelope: %v", err)
	}
	rt, _ := reg.Lookup("rug", "greet")
	if drift, _ := enforce.DefinitionDrift(rt, pc.Call.ToolDefinitionSHA256); !drift {
		t.Fatal("the worker would not see the report's hash drift from the pin")
	}
	// Back to the pin, then to a new hash, then back to the first: only
	// the new hash is reported.
	g.reportDrift(list(pin))
	g.reportDrift(list(hashB))
	g.reportDrift(list(hashA))
	if len(out.calls) != 2 || counted() != 2 || out.calls[1].ToolDefinitionSHA256 != hashB {
		t.Fatalf("drift to a new hash: %d sent, %v counted, want 2", len(out.calls), counted())
	}
	g.reportDrift(list(""))
	g.reportDrift(list(""))
	if len(out.calls) != 2 || counted() != 3 {
		t.Fatalf("unhashable definition: %d sent, %v counted, want 2 sent and 3 counted", len(out.calls), counted())
	}
}

// fullOutbox is an outbox that takes nothing until it has room.
type fullOutbox struct {
	sent
	full bool
}

func (o *fullOutbox) Full() bool { return o.full }

// TestReportDriftOutboxFull: a drift the outbox has no room for is not
// marked reported, so the next tool list reports it.
func TestReportDriftOutboxFull(t *testing.T) {
	pin, live := strings.Repeat("a", 64), strings.Repeat("b", 64)
	reg, err := enforce.NewRegistry([]byte(`{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "rug",
  "tools": [{"tool_name": "greet", "tool_class": "read", "is_document_op": false, "trust_level": "internal", "definition_sha256": "` + pin + `"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	out := &fullOutbox{full: true}
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"server_id", "tool"})
	g := &Gateway{o: Options{EPID: "gw-1", Registry: reg}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		driftRef: counter, drifted: map[string]bool{}, driftOut: out}
	byName := map[string]upstreamTool{"greet": {server: "rug", tool: &mcp.Tool{Name: "greet"}, def: live}}
	g.reportDrift(byName)
	if len(out.calls) != 0 || testutil.ToFloat64(counter.WithLabelValues("rug", "greet")) != 0 {
		t.Fatal("reported into a full outbox")
	}
	out.full = false
	g.reportDrift(byName)
	g.reportDrift(byName)
	if len(out.calls) != 1 || testutil.ToFloat64(counter.WithLabelValues("rug", "greet")) != 1 {
		t.Fatalf("after the outbox had room: %d sent, want 1", len(out.calls))
	}
}
