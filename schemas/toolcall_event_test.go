package schemas

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// fullToolCallEvent is a dev.talos.toolcall.v1 CloudEvent with every field
// of ToolCallEvent set (the signature is a dummy: the schema checks its
// form, not its validity).
func fullToolCallEvent() (map[string]any, ToolCallEvent) {
	ev := ToolCallEvent{
		Type: ToolCallEventKind, TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
		ToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", ToolID: "files/read_file", ToolVersion: "1.2.3",
		Transport: "mcp", SideEffect: SideEffectRead, Idempotency: IdempotencyIdempotent, IdempotencyKey: "k-1",
		Actor: Actor{Kind: "agent", AgentID: "agent-7", ModelID: "model-x"}, OK: false,
		ArgsRef: "sha256:" + strings.Repeat("a", 64), ArgsHash: strings.Repeat("a", 64),
		ResultRef: "sha256:" + strings.Repeat("b", 64), ResultHash: strings.Repeat("b", 64),
		Error:  &CallError{Code: "E_IO", Kind: "tool", Message: "no such file", Retryable: ptr(true)},
		Timing: EventTiming{StartedAt: "2025-01-15T10:20:30.123Z", EndedAt: "2025-01-15T10:20:30.200Z", DurationMS: 77},
		Resources: &ResourcesTouched{WorkspaceIDs: []string{"ws-1"}, Artifacts: []string{"sha256:" + strings.Repeat("c", 64)},
			Files: []string{"/work/a.txt"}, URLs: []string{"https://example.com/x"}},
		CapabilityIDs: []string{"cap-root", "cap-child"}, ParentSpanID: "span-1",
		SessionID: "sess-1", EPID: "gw-1", ServerID: "files", ToolName: "read_file", MCPMethod: MethodElicitationCreate, ParentToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6c", Phase: PhasePost,
		Decision: DecisionAllow, ReasonCodes: []string{CodeToolUnclassifiedAllowedDev},
		ReceiptID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d70", Flags: []string{FlagPostWithoutPre},
		Redactions: []Redaction{{Pointer: "/args/token", Rule: "github_token",
			Pseudonym: "hmac-sha256:rk1:" + strings.Repeat("d", 64)}},
		Payloads:  &Payloads{Args: jsonkit.Canonical(`{"token":"[REDACTED]"}`), Result: jsonkit.Canonical(`[1,"x",null]`)},
		Signature: &Signature{Alg: SignatureAlg, KID: "k1", Sig: strings.Repeat("A", 86)},
	}
	return map[string]any{
		"specversion": "1.0", "id": "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d71", "source": "talos://enforce/worker-1",
		"type": TypeToolCall, "subject": ev.ToolCallID, "time": "2025-01-15T10:20:30.201Z",
		"datacontenttype": "application/json", "data": ev,
	}, ev
}

// mutatedEvent round-trips fullToolCallEvent through a generic map so that
// a test can change it freely.
func mutatedEvent(t *testing.T, mutate func(ev, data map[string]any)) []byte {
	t.Helper()
	full, _ := fullToolCallEvent()
	var ev map[string]any
	if err := json.Unmarshal(mustJSON(t, full), &ev); err != nil {
		t.Fatal(err)
	}
	mutate(ev, ev["data"].(map[string]any))
	return mustJSON(t, ev)
}

func TestFullToolCallEventValidates(t *testing.T) {
	full, ev := fullToolCallEvent()
	b := mustJSON(t, full)
	assertAllKeys(t, reflect.TypeFor[ToolCallEvent](), mustJSON(t, ev))
	assertAllKeys(t, reflect.TypeFor[EventTiming](), mustJSON(t, ev.Timing))
	assertAllKeys(t, reflect.TypeFor[ResourcesTouched](), mustJSON(t, ev.Resources))
	assertAllKeys(t, reflect.TypeFor[Redaction](), mustJSON(t, ev.Redactions[0]))
	assertAllKeys(t, reflect.TypeFor[Payloads](), mustJSON(t, ev.Payloads))
	assertAllKeys(t, reflect.TypeFor[Actor](), mustJSON(t, ev.Actor))
	assertAllKeys(t, reflect.TypeFor[CallError](), mustJSON(t, ev.Error))
	if err := ValidateToolCallEvent(b); err != nil {
		t.Fatalf("fully populated ToolCallEvent: %v", err)
	}
	// A minimal one (every omitempty field absent) validates too.
	min := mutatedEvent(t, func(_, d map[string]any) {
		for _, k := range []string{"idempotency_key", "args_ref", "args_hash", "result_ref", "result_hash", "error",
			"resources_touched", "capability_ids", "parent_span_id", "flags", "payloads"} {
			delete(d, k)
		}
		d["actor"] = map[string]any{"kind": "system"}
		d["redactions"] = []any{}
	})
	if err := ValidateToolCallEvent(min); err != nil {
		t.Fatalf("minimal ToolCallEvent: %v", err)
	}
}

// UTS FR-EVT-007: the flight recorder MUST reject events missing trace_id,
// tool_call_id, tool_id or tool_version; absent and empty are both missing.
func TestToolCallEventRequiredFields(t *testing.T) {
	for _, field := range []string{"trace_id", "tool_call_id", "tool_id", "tool_version"} {
		t.Run(field+" absent", func(t *testing.T) {
			err := ValidateToolCallEvent(mutatedEvent(t, func(_, d map[string]any) { delete(d, field) }))
			if err == nil || !strings.Contains(err.Error(), "/data: required: missing "+field) {
				t.Fatalf("want a required error naming %s, got %v", field, err)
			}
		})
		t.Run(field+" empty", func(t *testing.T) {
			err := ValidateToolCallEvent(mutatedEvent(t, func(_, d map[string]any) { d[field] = "" }))
			if err == nil || !strings.Contains(err.Error(), "/data/"+field+":") {
				t.Fatalf("want an error at /data/%s, got %v", field, err)
			}
		})
	}
}

func TestToolCallEventSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(ev, d map[string]any)
		detail string
	}{
		{"receipt type", func(ev, _ map[string]any) { ev["type"] = TypeReceiptDecision }, "/type: const"},
		{"unknown attr", func(ev, _ map[string]any) { ev["traceparent"] = "x" }, "/: additionalProperties"},
		{"unknown data field", func(_, d map[string]any) { d["raw_args"] = "x" }, "/data: additionalProperties"},
		{"trace_id not uuid", func(_, d map[string]any) { d["trace_id"] = "trace-1" }, "/data/trace_id: pattern"},
		{"kind", func(_, d map[string]any) { d["type"] = "tool_result" }, "/data/type: const"},
		{"transport", func(_, d map[string]any) { d["transport"] = "grpc" }, "/data/transport: enum"},
		{"side_effect", func(_, d map[string]any) { d["side_effect"] = "read" }, "/data/side_effect: enum"},
		{"idempotency", func(_, d map[string]any) { d["idempotency"] = "MAYBE" }, "/data/idempotency: enum"},
		{"args_ref without sha256:", func(_, d map[string]any) { d["args_ref"] = strings.Repeat("a", 64) }, "/data/args_ref: pattern"},
		{"args_hash without args_ref", func(_, d map[string]any) { delete(d, "args_ref") }, "/data: dependentRequired: args_hash needs args_ref"},
		{"negative duration", func(_, d map[string]any) { d["timing"].(map[string]any)["duration_ms"] = -1 }, "/data/timing/duration_ms: minimum"},
		{"timing without ended_at", func(_, d map[string]any) { delete(d["timing"].(map[string]any), "ended_at") }, "/data/timing: required: missing ended_at"},
		{"pseudonym without key id", func(_, d map[string]any) {
			d["redactions"].([]any)[0].(map[string]any)["pseudonym"] = "hmac-sha256::" + strings.Repeat("d", 64)
		}, "/data/redactions/0/pseudonym: pattern"},
		{"pseudonym is the secret", func(_, d map[string]any) {
			d["redactions"].([]any)[0].(map[string]any)["pseudonym"] = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
		}, "/data/redactions/0/pseudonym: pattern"},
		{"pointer not a JSON pointer", func(_, d map[string]any) {
			d["redactions"].([]any)[0].(map[string]any)["pointer"] = "args/token"
		}, "/data/redactions/0/pointer: pattern"},
		{"pointer with a bad escape", func(_, d map[string]any) {
			d["redactions"].([]any)[0].(map[string]any)["pointer"] = "/args/a~2b"
		}, "/data/redactions/0/pointer: pattern"},
		{"redactions null", func(_, d map[string]any) { d["redactions"] = nil }, "/data/redactions: type"},
		{"unknown payload member", func(_, d map[string]any) { d["payloads"].(map[string]any)["raw"] = "x" }, "/data/payloads: additionalProperties"},
		{"unsigned", func(_, d map[string]any) { delete(d, "signature") }, "/data: required: missing signature"},
		{"receipt_id not v7", func(_, d map[string]any) { d["receipt_id"] = "0190f5b2-7c1e-4a3b-8d4e-1f2a3b4c5d70" }, "/data/receipt_id: pattern"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateToolCallEvent(mutatedEvent(t, tc.mutate))
			if err == nil || !strings.Contains(err.Error(), tc.detail) {
				t.Fatalf("want %q, got %v", tc.detail, err)
			}
			if strings.Contains(err.Error(), "ghp_") {
				t.Fatalf("error echoes a value: %v", err)
			}
		})
	}
}
