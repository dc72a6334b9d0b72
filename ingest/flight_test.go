package ingest_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/kv"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
)

// flightPolicy allows the test agent every tool of "files" and only
// list-prs on "github", and rate-limits list_directory to 3 a minute.
const flightPolicy = `{
  "rules": [
    {"name": "files", "agents": ["agent-test-ep"], "servers": ["files"], "tools": ["*"]},
    {"name": "github-read", "agents": ["agent-test-ep"], "servers": ["github"], "tools": ["list-prs"]}
  ],
  "rate_limits": [
    {"name": "listing", "agents": ["*"], "servers": ["files"], "tools": ["list_directory"], "limit": 3, "window": "1m"}
  ]
}`

// flightStack is a pipeline with preflight, a policy with a rate limit
// counted in the shared KV store, the call ledger and the redactor.
func flightStack(t *testing.T) (*stack, *redact.Redactor) {
	t.Helper()
	red, err := redact.New(redact.Config{Key: []byte(strings.Repeat("k", 32)), KeyID: "test"})
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, stackOptions{configure: func(t *testing.T, js jetstream.JetStream, o *enforce.DeciderOptions) {
		ctx := context.Background()
		p, err := enforce.ParsePolicy([]byte(flightPolicy))
		if err != nil {
			t.Fatal(err)
		}
		store, err := kv.NewKVRateStore(ctx, js, p.MaxWindow(), 1)
		if err != nil {
			t.Fatal(err)
		}
		ledger := newLedger(t, js)
		o.Policy, o.RateLimiter, o.Ledger, o.Redactor = p, enforce.NewRateLimiter(p, store), ledger, red
	}})
	return s, red
}

// pathAttacks escape the demo registry's workspace root (/workspace).
var pathAttacks = []string{
	"../../etc/passwd",
	"/etc/passwd",
	"docs/../../secret",
	"..",
	"./../x",
	"a/b/../../../c",
	"%2e%2e/%2e%2e/etc/passwd",
	"%252e%252e%252fetc",
	"..%2fetc%2fpasswd",
	"%c0%ae%c0%ae/etc",
	`..\..\windows\system32`,
	`C:\Windows\win.ini`,
	`\\server\share\x`,
	"~/.ssh/id_rsa",
	"file:///etc/passwd",
	"/workspace2/x",
	"/workspace/../etc/passwd",
	"\uff0e\uff0e\uff0fetc",
	"/proc/self/root/etc/passwd",
	"docs/\x00.txt",
}

// TestPreflightCodesThroughPipeline: every preflight code, produced by a
// real worker over NATS, with its receipt in ClickHouse and a ToolCallEvent
// row in tool_calls.
func TestPreflightCodesThroughPipeline(t *testing.T) {
	s, _ := flightStack(t)
	deny := func(t *testing.T, c *schemas.ToolCall, code string) *schemas.Decision {
		t.Helper()
		d := s.call(t, c)
		if d.Decision != schemas.DecisionDeny || !slices.Contains(d.ReasonCodes, code) {
			t.Fatalf("got %s %v, want deny with %s (details %v)", d.Decision, d.ReasonCodes, code, d.Details)
		}
		for _, det := range d.Details {
			if strings.Contains(det, "SURPRISE") {
				t.Fatalf("a detail echoes an argument value: %q", det)
			}
		}
		return d
	}
	var denied []*schemas.Decision
	denied = append(denied,
		deny(t, newCall(t, "files", "read_file", map[string]any{"path": "a.txt", "SURPRISE": 1}), schemas.CodeDenyUnknownFields),
		deny(t, newCall(t, "files", "read_file", map[string]any{"path": 42}), schemas.CodeDenySchemaViolation),
		deny(t, func() *schemas.ToolCall {
			c := newCall(t, "files", "upload_blob", map[string]any{"data": strings.Repeat("QUFB", 40000)})
			c.IdempotencyKey = "big-1"
			return c
		}(), schemas.CodeDenyPayloadTooLarge),
		deny(t, newCall(t, "github", "create-pr", map[string]any{"title": "x", "body": "y"}), schemas.CodeDenyNoMatchingRule),
	)
	for i, p := range pathAttacks {
		t.Run(fmt.Sprintf("path %d", i), func(t *testing.T) {
			denied = append(denied, deny(t, newCall(t, "files", "read_file", map[string]any{"path": p}), schemas.CodeDenyPathTraversal))
		})
	}
	if d := s.call(t, newCall(t, "files", "read_file", map[string]any{"path": "docs/a..b.txt"})); d.Decision != schemas.DecisionAllow {
		t.Fatalf("a benign path: %s %v %v", d.Decision, d.ReasonCodes, d.Details)
	}
	for i := 0; i < 3; i++ {
		if d := s.call(t, newCall(t, "files", "list_directory", map[string]any{"path": "."})); d.Decision != schemas.DecisionAllow {
			t.Fatalf("listing %d: %s %v", i, d.Decision, d.ReasonCodes)
		}
	}
	denied = append(denied, deny(t, newCall(t, "files", "list_directory", map[string]any{"path": "."}), schemas.CodeDenyRateLimit))

	// Each deny: its receipt, and a ToolCallEvent row with ok = 0 and the
	// first reason code as error_code.
	for _, d := range denied {
		s.waitRows(t, query.ViewReceipts, fmt.Sprintf("receipt_id = '%s'", d.ReceiptID), 1)
		s.waitRows(t, query.ViewToolCalls, fmt.Sprintf("tool_call_id = '%s' AND ok = 0 AND error_code = '%s' AND receipt_id = '%s'",
			d.ToolCallID, d.ReasonCodes[0], d.ReceiptID), 1)
	}
	// Every attack string has its own DENY_PATH_TRAVERSAL receipt, and no
	// other call of this test was denied for a path (but the non-string
	// path, which is both a schema violation and not a confinable path).
	const pathDenied = "has(reason_codes, 'DENY_PATH_TRAVERSAL') AND NOT has(reason_codes, 'DENY_SCHEMA_VIOLATION')"
	s.waitRows(t, query.ViewReceipts, pathDenied, uint64(len(pathAttacks)))
	var n uint64
	if err := s.conn.QueryRow(context.Background(), fmt.Sprintf("SELECT count() FROM %s.%s WHERE %s",
		s.db, query.ViewReceipts, pathDenied)).Scan(&n); err != nil || n != uint64(len(pathAttacks)) {
		t.Fatalf("%d DENY_PATH_TRAVERSAL receipts for %d attack strings (%v)", n, len(pathAttacks), err)
	}
}

// TestToolCallEventsRecordEveryCall: an allowed call with its post event,
// a denied call, a post with no pre decision and a malformed envelope each
// leave exactly the record UTS FR-EVT-007 asks for; the four required
// fields are enforced, and the hashes are reproducible from the stored
// artifacts.
func TestToolCallEventsRecordEveryCall(t *testing.T) {
	s, _ := flightStack(t)
	ctx := context.Background()

	// Allowed, then its post event.
	pre := newCall(t, "files", "write_file", map[string]any{"path": "notes/a.txt", "content": "see https://example.com/x"})
	pre.IdempotencyKey = "w-1"
	pre.ParentSpanID = "span-7"
	pre.Actor.ModelID = "model-x"
	if d := s.call(t, pre); d.Decision != schemas.DecisionAllow {
		t.Fatalf("pre: %s %v %v", d.Decision, d.ReasonCodes, d.Details)
	}
	started := time.Now().Add(-40 * time.Millisecond)
	post, err := ep.PostOf(pre, map[string]any{"content": []any{map[string]any{"type": "text", "text": "ok"}}}, true, started, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	postDec := s.call(t, post)
	s.waitRows(t, query.ViewToolCalls, fmt.Sprintf("tool_call_id = '%s'", pre.ToolCallID), 1)
	rows, err := query.ToolCalls(ctx, s.conn, s.db, 100)
	if err != nil {
		t.Fatal(err)
	}
	var row *query.ToolCallRow
	for i := range rows {
		if rows[i].ToolCallID == pre.ToolCallID {
			row = &rows[i]
		}
	}
	if row == nil {
		t.Fatal("no tool_calls row for the allowed call")
	}
	want := map[string]bool{
		"trace_id":        row.TraceID == pre.TraceID,
		"tool_id":         row.ToolID == "files/write_file",
		"tool_version":    row.ToolVersion == "1.2.0",
		"transport":       row.Transport == "mcp",
		"side_effect":     row.SideEffect == schemas.SideEffectWrite,
		"idempotency":     row.Idempotency == schemas.IdempotencyWithKey,
		"idempotency_key": row.IdempotencyKey == "w-1",
		"actor":           row.ActorKind == "agent" && row.AgentID == "agent-test-ep" && row.ModelID == "model-x",
		"ok":              row.OK,
		"args":            len(row.ArgsHash) == 64 && row.ArgsRef == "sha256:"+row.ArgsHash,
		"result":          len(row.ResultHash) == 64 && row.ResultRef == "sha256:"+row.ResultHash,
		"timing":          row.DurationMS >= 30 && !row.EndedAt.Before(row.StartedAt),
		"resources":       slices.Equal(row.ResourcesFiles, []string{"notes/a.txt"}) && slices.Equal(row.ResourcesURLs, []string{"https://example.com/x"}),
		"parent_span_id":  row.ParentSpanID == "span-7",
		"receipt":         row.ReceiptID == postDec.ReceiptID && row.Phase == schemas.PhasePost,
		"no flags":        len(row.Flags) == 0,
	}
	for field, ok := range want {
		if !ok {
			t.Errorf("tool_calls %s: not as expected (row %+v)", field, *row)
		}
	}
	// The hashes are sha256 of the stored redacted artifacts.
	arts, err := query.Artifacts(ctx, s.conn, s.db, []string{row.ArgsRef, row.ResultRef})
	if err != nil {
		t.Fatal(err)
	}
	if len(arts) != 2 {
		t.Fatalf("%d artifacts for args and result", len(arts))
	}
	for _, a := range arts {
		sum := sha256.Sum256(a.Content)
		if "sha256:"+hex.EncodeToString(sum[:]) != a.Ref {
			t.Fatalf("artifact %s does not hash to its ref", a.Ref)
		}
	}

	// A post event no worker decided in phase pre is recorded and flagged.
	orphan := newCall(t, "files", "read_file", map[string]any{"path": "x.txt"})
	orphanPost, _ := ep.PostOf(orphan, map[string]any{"content": []any{}}, true, time.Now(), time.Now())
	s.call(t, orphanPost)
	s.waitRows(t, query.ViewToolCalls, fmt.Sprintf("tool_call_id = '%s' AND has(flags, '%s')", orphan.ToolCallID, schemas.FlagPostWithoutPre), 1)

	// A malformed envelope that still names its trace and tool is a row;
	// one without a trace_id is rejected (UTS FR-EVT-007) and kept as a rejection.
	named := newCall(t, "files", "read_file", map[string]any{"path": "y.txt"})
	raw, _ := json.Marshal(named)
	bad := []byte(strings.Replace(string(raw), `"transport":"mcp"`, `"transport":"pigeon"`, 1))
	if _, err := s.client.Send(ctx, schemas.PhasePre, "files", named.ToolCallID, bad); err != nil {
		t.Fatal(err)
	}
	s.waitRows(t, query.ViewToolCalls, fmt.Sprintf("tool_call_id = '%s' AND error_code = 'VAL-HTC-001'", named.ToolCallID), 1)
	anon := newCall(t, "files", "read_file", map[string]any{"path": "z.txt"})
	raw, _ = json.Marshal(anon)
	noTrace := []byte(strings.Replace(string(raw), `"trace_id":"`+anon.TraceID+`",`, ``, 1))
	if _, err := s.client.Send(ctx, schemas.PhasePre, "files", anon.ToolCallID, noTrace); err != nil {
		t.Fatal(err)
	}
	s.waitRows(t, query.TableToolCallRejections, "has(missing, 'trace_id')", 1)
	s.waitRows(t, query.ViewReceipts, fmt.Sprintf("tool_call_id = '%s'", anon.ToolCallID), 1)
	var n uint64
	if err := s.conn.QueryRow(ctx, fmt.Sprintf("SELECT count() FROM %s.tool_calls WHERE tool_call_id = '%s'", s.db, anon.ToolCallID)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a rejected event reached tool_calls: %d rows (%v)", n, err)
	}

	rep, err := query.VerifyDatabase(ctx, s.conn, s.db, s.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("verify: %+v", rep.Problems)
	}
}
