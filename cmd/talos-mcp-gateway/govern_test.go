package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/gateway"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// governRegistry is the shipped registry of server-everything without its
// prompt resource-prompt and its resource dynamic-blob.
func governRegistry(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(registryDir, "everything.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := schemas.ParseManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	m.Prompts = slices.DeleteFunc(m.Prompts, func(p schemas.Prompt) bool { return p.Name == "resource-prompt" })
	m.Resources = slices.DeleteFunc(m.Resources, func(r schemas.Resource) bool { return r.Name == "dynamic-blob" })
	dir := t.TempDir()
	writeJSON(t, filepath.Join(dir, "everything.json"), m)
	return dir
}

// denialOf is the denial a refused request's error carries, nil if none.
func denialOf(err error) *gateway.Denial {
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != gateway.CodeDenied {
		return nil
	}
	var d gateway.Denial
	if json.Unmarshal(we.Data, &d) != nil {
		return nil
	}
	return &d
}

// callIDs are the tool_call_id and receipt_id a forwarded result names.
func callIDs(t *testing.T, what string, meta mcp.Meta) string {
	t.Helper()
	id, _ := meta[gateway.MetaToolCallID].(string)
	rid, _ := meta[gateway.MetaReceiptID].(string)
	if id == "" || rid == "" {
		t.Fatalf("%s: the result's _meta names no tool_call_id/receipt_id: %v", what, meta)
	}
	return id
}

// TestGovernPromptsAndResources (issue 21, must-show 2): behind the
// gateway in stdio mode with talosd in prod, the real server-everything's
// prompts/get and resources/read are decided by Talos like tools/call.
// The client is offered only the prompts and resources the registry
// lists; a listed prompt (its arguments and result carrying a planted
// secret) and a static and a templated resource are forwarded, each with a
// verified allow receipt, an effect receipt and a ToolCallEvent in
// ClickHouse, visible in v_decisions with its mcp_method signed in the
// receipt; an unlisted prompt and an unlisted resource are denied with a
// receipt whose id the JSON-RPC error carries. The secret reaches no
// table, talosctl verify passes, and talosctl registry lint reports the
// unlisted prompt and resource template of the live server.
func TestGovernPromptsAndResources(t *testing.T) {
	reg := governRegistry(t)
	s := startStackRegistry(t, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	everything := testenv.MCPBin(t, "mcp-server-everything")
	cs := s.gatewaySession(ctx, "--ep-id", "gw-govern", "--upstream", "everything="+everything).cs

	var prompts []string
	for p, err := range cs.Prompts(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		prompts = append(prompts, p.Name)
	}
	if !slices.Contains(prompts, "args-prompt") || slices.Contains(prompts, "resource-prompt") {
		t.Fatalf("prompts/list %v: want the registry's prompts only", prompts)
	}
	var templates []string
	for rt, err := range cs.ResourceTemplates(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		templates = append(templates, rt.URITemplate)
	}
	if !slices.Contains(templates, "demo://resource/dynamic/text/{resourceId}") || slices.Contains(templates, "demo://resource/dynamic/blob/{resourceId}") {
		t.Fatalf("resources/templates/list %v: want the registry's templates only", templates)
	}

	const secret = "AKIAQ3M7ZP2XWT6LRV4K"
	allowed := map[string]string{} // tool_call_id → tool_name
	got, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "args-prompt", Arguments: map[string]string{"city": "Lisbon " + secret}})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(got.Messages); !strings.Contains(string(b), "Lisbon") {
		t.Fatalf("prompts/get args-prompt: %s", b)
	}
	allowed[callIDs(t, "args-prompt", got.Meta)] = "args-prompt"
	for uri, name := range map[string]string{"demo://resource/static/document/architecture.md": "static-documents", "demo://resource/dynamic/text/7": "dynamic-text"} {
		read, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("resources/read %s: %v", uri, err)
		}
		if len(read.Contents) != 1 || read.Contents[0].Text == "" {
			t.Fatalf("resources/read %s: %+v", uri, read.Contents)
		}
		allowed[callIDs(t, uri, read.Meta)] = name
	}

	denied := map[string]*gateway.Denial{}
	_, err = cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "resource-prompt", Arguments: map[string]string{"resourceType": "Text", "resourceId": "1"}})
	denied["resource-prompt"] = denialOf(err)
	_, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://resource/dynamic/blob/3"})
	denied["blob"] = denialOf(err)
	for what, d := range denied {
		if d == nil || d.ReceiptID == "" || !slices.Contains(d.ReasonCodes, schemas.CodeToolUnclassifiedDenied) || !slices.Contains(d.ReasonCodes, schemas.CodeUnknownTool) {
			t.Fatalf("%s: want a denial with TOOL_UNCLASSIFIED_DENIED and UNKNOWN_TOOL carrying its receipt id, got %+v", what, d)
		}
	}

	conn := s.clickhouse(t, ctx)
	defer conn.Close()
	count := rowCounter(ctx, t, conn)
	for id, name := range allowed {
		testenv.WaitUntil(t, 60*time.Second, 300*time.Millisecond, "the records of "+name, func() bool {
			return count("SELECT count() FROM v_decisions WHERE tool_call_id = ? AND kind = 'decision' AND decision = 'allow' AND tool_name = ?", id, name) == 1 &&
				count("SELECT count() FROM v_decisions WHERE tool_call_id = ? AND kind = 'effect'", id) == 1 &&
				count("SELECT count() FROM v_tool_calls WHERE tool_call_id = ? AND ok = 1 AND result_hash != ''", id) == 1
		})
		method := schemas.MethodResourcesRead
		if name == "args-prompt" {
			method = schemas.MethodPromptsGet
		}
		if n := count("SELECT count() FROM receipts WHERE tool_call_id = ? AND position(cloudevent, ?) > 0", id, `"mcp_method":"`+method+`"`); n == 0 {
			t.Fatalf("the receipts of %s do not name mcp_method %s", name, method)
		}
		// The method is a column of the auditors' views too.
		if count("SELECT count() FROM v_mcp_requests WHERE tool_call_id = ? AND method = ? AND tool_name = ? AND decision = 'allow'", id, method, name) != 1 ||
			count("SELECT count() FROM v_tool_calls WHERE tool_call_id = ? AND mcp_method = ?", id, method) != 1 {
			t.Fatalf("v_mcp_requests or v_tool_calls does not show %s as a %s", name, method)
		}
	}
	for what, d := range denied {
		testenv.WaitUntil(t, 60*time.Second, 300*time.Millisecond, "the denial of "+what, func() bool {
			return count("SELECT count() FROM v_decisions WHERE tool_call_id = ? AND receipt_id = ? AND decision = 'deny' AND has(reason_codes, ?)",
				d.ToolCallID, d.ReceiptID, schemas.CodeToolUnclassifiedDenied) == 1 &&
				count("SELECT count() FROM v_tool_calls WHERE tool_call_id = ? AND ok = 0", d.ToolCallID) == 1
		})
		method := map[string]string{"resource-prompt": schemas.MethodPromptsGet, "blob": schemas.MethodResourcesRead}[what]
		if count("SELECT count() FROM v_mcp_requests WHERE tool_call_id = ? AND method = ? AND decision = 'deny'", d.ToolCallID, method) != 1 {
			t.Fatalf("v_mcp_requests does not show the denied %s as a %s", what, method)
		}
	}
	for _, table := range []string{"receipts", "tool_calls", "artifacts"} {
		q := fmt.Sprintf("SELECT count() FROM %s WHERE positionCaseInsensitive(toString(tuple(*)), ?) > 0", table)
		if n := count(q, secret); n != 0 {
			t.Fatalf("the planted secret reached %s (%d rows)", table, n)
		}
	}
	if out, code := s.ctlCode("verify", "--trusted-keys", filepath.Join(s.dir, "worker.pub")); code != 0 {
		t.Fatalf("talosctl verify: exit %d\n%s", code, out)
	}

	out, code := s.ctlCode("registry", "lint", "--server", "everything="+everything, "--registry", reg)
	if code != 1 || !strings.Contains(out, "MISSING_PROMPT    everything/resource-prompt") ||
		!strings.Contains(out, "demo://resource/dynamic/blob/{resourceId}") || !strings.Contains(out, "1 missing prompts, 1 missing resources") {
		t.Fatalf("registry lint: exit %d, want 1 with the unlisted prompt and resource template\n%s", code, out)
	}
}

// TestServerRequestsRecorded (issue 21, must-show 3): behind the gateway
// in stdio mode, the real server-everything's sampling, elicitation and
// roots/list requests during a tool call reach the client, whose answers
// go back, and each is recorded in ClickHouse: an allow receipt and a
// ToolCallEvent whose tool_name and mcp_method are the method, in the
// call's trace, naming the call (parent_tool_call_id, a column as in its
// signed JSON), with what the server asked redacted (a planted secret
// reaches no table) and what came back only as its hash; v_server_requests
// shows each beside its call, and talosctl verify passes.
func TestServerRequestsRecorded(t *testing.T) {
	s := startStackRegistry(t, relayRegistry(t))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rc := &relayClient{}
	client := mcp.NewClient(&mcp.Implementation{Name: "record-test", Version: "1"}, rc.options())
	client.AddRoots(&mcp.Root{URI: "file:///srv/record-root", Name: "record-root"})
	gw := s.gatewayClient(ctx, client, "--ep-id", "gw-record", "--upstream", "everything="+testenv.MCPBin(t, "mcp-server-everything"))

	const secret = "AKIAR5N2XW7QMT4LPV6J"
	sampled := gw.call(ctx, "trigger-sampling-request", map[string]any{"prompt": "relay me " + secret, "maxTokens": 10}).mustAllow(t, "sampling")
	if !strings.Contains(text(sampled), "sampled by the client") {
		t.Fatalf("the sampling result did not come from the client: %s", text(sampled))
	}
	rc.waitFor(t, "the sampling request", func() bool { return len(rc.sampled) == 1 && strings.Contains(rc.sampled[0], "relay me") })
	elicited := gw.call(ctx, "trigger-elicitation-request", map[string]any{}).mustAllow(t, "elicitation")
	if !strings.Contains(text(elicited), "Ada Lovelace") {
		t.Fatalf("the elicitation result did not come from the client: %s", text(elicited))
	}
	rooted := gw.call(ctx, "get-roots-list", map[string]any{}).mustAllow(t, "get-roots-list")
	if !strings.Contains(text(rooted), "file:///srv/record-root") {
		t.Fatalf("roots/list did not reach the client: %s", text(rooted))
	}

	conn := s.clickhouse(t, ctx)
	defer conn.Close()
	parents := map[string]*mcp.CallToolResult{schemas.MethodSamplingCreateMessage: sampled, schemas.MethodElicitationCreate: elicited,
		schemas.MethodRootsList: rooted}
	tools := map[string]string{schemas.MethodSamplingCreateMessage: "trigger-sampling-request",
		schemas.MethodElicitationCreate: "trigger-elicitation-request", schemas.MethodRootsList: "get-roots-list"}
	for method, res := range parents {
		parent := res.Meta[gateway.MetaToolCallID].(string)
		var id, traceID, resultRef, event, parentTrace string
		deadline := time.Now().Add(60 * time.Second)
		for {
			err := conn.QueryRow(ctx, "SELECT tool_call_id, trace_id, result_ref, cloudevent FROM v_tool_calls WHERE tool_name = ? AND mcp_method = ? AND parent_tool_call_id = ? AND ok = 1",
				method, method, parent).Scan(&id, &traceID, &resultRef, &event)
			if err == nil && conn.QueryRow(ctx, "SELECT trace_id FROM v_tool_calls WHERE tool_call_id = ?", parent).Scan(&parentTrace) == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no record of %s during call %s: %v", method, parent, err)
			}
			time.Sleep(300 * time.Millisecond)
		}
		if traceID != parentTrace {
			t.Fatalf("%s recorded in trace %s, its call in %s", method, traceID, parentTrace)
		}
		if !strings.Contains(event, `"parent_tool_call_id":"`+parent+`"`) {
			t.Fatalf("the signed event of %s does not name its call %s: %s", method, parent, event)
		}
		assertWorkerAllowed(ctx, t, s, id)
		var parentMethod, parentTool, decision string
		if err := conn.QueryRow(ctx, "SELECT parent_method, parent_tool_name, decision FROM v_server_requests WHERE tool_call_id = ? AND method = ? AND parent_tool_call_id = ?",
			id, method, parent).Scan(&parentMethod, &parentTool, &decision); err != nil {
			t.Fatalf("v_server_requests has no %s during %s: %v", method, parent, err)
		}
		if parentMethod != schemas.MethodToolsCall || parentTool != tools[method] || decision != schemas.DecisionAllow {
			t.Fatalf("v_server_requests: %s during a %s of %s (%s), want during a tools/call of %s (allow)", method, parentMethod, parentTool, decision, tools[method])
		}
		var content string
		if err := conn.QueryRow(ctx, "SELECT content FROM artifacts WHERE ref = ? LIMIT 1", resultRef).Scan(&content); err != nil {
			t.Fatalf("the recorded answer of %s: %v", method, err)
		}
		var answer map[string]string
		if err := json.Unmarshal([]byte(content), &answer); err != nil || len(answer["sha256"]) != 64 {
			t.Fatalf("%s: the answer is recorded as %s, want its sha256 only", method, content)
		}
		if method == schemas.MethodElicitationCreate && (answer["action"] != "accept" || len(answer) != 2) {
			t.Fatalf("elicitation answer recorded as %s, want its sha256 and action", content)
		}
		if method != schemas.MethodElicitationCreate && len(answer) != 1 {
			t.Fatalf("%s answer recorded as %s, want its sha256 only", method, content)
		}
	}
	for _, table := range []string{"receipts", "tool_calls", "artifacts"} {
		var n uint64
		q := fmt.Sprintf("SELECT count() FROM %s WHERE positionCaseInsensitive(toString(tuple(*)), ?) > 0", table)
		if err := conn.QueryRow(ctx, q, secret).Scan(&n); err != nil || n != 0 {
			t.Fatalf("the planted secret reached %s (%d rows, %v)", table, n, err)
		}
	}
	if out, code := s.ctlCode("verify", "--trusted-keys", filepath.Join(s.dir, "worker.pub")); code != 0 {
		t.Fatalf("talosctl verify: exit %d\n%s", code, out)
	}
}

// assertWorkerAllowed waits for the call's decision receipt in ClickHouse
// and checks the worker allowed it.
func assertWorkerAllowed(ctx context.Context, t *testing.T, s *stack, id string) {
	t.Helper()
	if decision, codes := waitDecision(ctx, t, s, id, "tool_call_id = ?", id); decision != schemas.DecisionAllow {
		t.Fatalf("receipt of %s: %s %v, want allow", id, decision, codes)
	}
}
