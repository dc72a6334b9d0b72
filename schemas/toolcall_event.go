package schemas

import "github.com/talos-audit/talos/schemas/jsonkit"

// ToolCallEvent is the data of a dev.talos.toolcall.v1 CloudEvent: the
// UTS FR-EVT-007 flight-recorder record of one tool call
// (schemas/talos/toolcall_event.schema.json), published on
// talos.audit.toolcall.<server_id> with Nats-Msg-Id ToolCallEventMsgID.
//
// Arguments and results appear only redacted: Payloads carries the
// redacted JSON (RFC 8785 form), ArgsHash/ResultHash are sha256 of exactly
// those bytes and ArgsRef/ResultRef name them ("sha256:<hex>"), as stored
// in talos.artifacts. Redactions says which pointers were replaced and by
// which rule, with a keyed pseudonym of each secret, never the secret.
//
// A record missing trace_id, tool_call_id, tool_id or tool_version is
// rejected by the recorder (UTS FR-EVT-007) and kept only as a rejection.
type ToolCallEvent struct {
	Type           string            `json:"type"` // "tool_call"
	TraceID        string            `json:"trace_id"`
	ToolCallID     string            `json:"tool_call_id"`
	ToolID         string            `json:"tool_id"` // <server_id>/<tool_name>
	ToolVersion    string            `json:"tool_version"`
	Transport      string            `json:"transport"`
	SideEffect     string            `json:"side_effect"`
	Idempotency    string            `json:"idempotency"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Actor          Actor             `json:"actor"`
	OK             bool              `json:"ok"`
	ArgsRef        string            `json:"args_ref,omitempty"`
	ArgsHash       string            `json:"args_hash,omitempty"`
	ResultRef      string            `json:"result_ref,omitempty"`
	ResultHash     string            `json:"result_hash,omitempty"`
	Error          *CallError        `json:"error,omitempty"`
	Timing         EventTiming       `json:"timing"`
	Resources      *ResourcesTouched `json:"resources_touched,omitempty"`
	CapabilityIDs  []string          `json:"capability_ids,omitempty"`
	ParentSpanID   string            `json:"parent_span_id,omitempty"`

	// Talos's additions: where the call came from and how it was decided.
	SessionID string `json:"session_id"`
	EPID      string `json:"ep_id"`
	ServerID  string `json:"server_id"`
	ToolName  string `json:"tool_name"`
	// MCPMethod is the envelope's mcp_method: "" for a tools/call.
	MCPMethod string `json:"mcp_method,omitempty"`
	// ParentToolCallID is the envelope's (a server request's call).
	ParentToolCallID string   `json:"parent_tool_call_id,omitempty"`
	Phase            string   `json:"phase"` // the phase whose envelope completed the record
	Decision         string   `json:"decision"`
	ReasonCodes      []string `json:"reason_codes"`
	// ReceiptID is the receipt of the envelope that completed the record
	// (a deny's decision receipt, or the post event's effect receipt).
	ReceiptID string `json:"receipt_id"`
	// Flags mark anomalies: FlagPostWithoutPre, FlagPostAfterDeny.
	Flags      []string    `json:"flags,omitempty"`
	Redactions []Redaction `json:"redactions"`
	Payloads   *Payloads   `json:"payloads,omitempty"`
	Signature  *Signature  `json:"signature,omitempty"`
}

// ToolCallEvent constants.
const (
	ToolCallEventKind = "tool_call"
	// FlagPostWithoutPre: a post event arrived for a tool_call_id no worker
	// decided in phase pre.
	FlagPostWithoutPre = "post_without_pre"
	// FlagPostAfterDeny: a post event arrived for a call whose pre phase was
	// denied (the tool should not have run).
	FlagPostAfterDeny = "post_after_deny"
	// UnregisteredToolVersion is the tool_version of a tool the registry
	// does not classify (and of a classified one with no version and no
	// server_version).
	UnregisteredToolVersion = "0.0.0-unregistered"
)

// EventTiming is FR-EVT-007's timing.
type EventTiming struct {
	StartedAt  string `json:"started_at"`
	EndedAt    string `json:"ended_at"`
	DurationMS int64  `json:"duration_ms"`
}

// ResourcesTouched is FR-EVT-007's resources_touched (redacted values).
type ResourcesTouched struct {
	WorkspaceIDs []string `json:"workspace_ids,omitempty"`
	Artifacts    []string `json:"artifacts,omitempty"`
	Files        []string `json:"files,omitempty"`
	URLs         []string `json:"urls,omitempty"`
}

// Redaction records one replaced secret: where (a JSON pointer under
// "/args" or "/result"), which rule found it, and its keyed pseudonym
// "hmac-sha256:<key_id>:<hex>" (HMAC-SHA256 of the secret value).
type Redaction struct {
	Pointer   string `json:"pointer"`
	Rule      string `json:"rule"`
	Pseudonym string `json:"pseudonym"`
}

// Payloads are the redacted arguments and result, each the RFC 8785 bytes
// whose sha256 is args_hash / result_hash.
type Payloads struct {
	Args   jsonkit.Canonical `json:"args,omitempty"`
	Result jsonkit.Canonical `json:"result,omitempty"`
}

// ToolCallEventMsgID is the TALOS_AUDIT Nats-Msg-Id of a call's
// ToolCallEvent: one per call. callID is as for AuditMsgID.
func ToolCallEventMsgID(callID string) string { return callID + ":toolcall" }
