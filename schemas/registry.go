package schemas

import "encoding/json"

// Manifest is one server's tool registry manifest
// (schemas/mcp/tool_registry.schema.json, REG 9.2.0).
type Manifest struct {
	SchemaID      string `json:"schema_id"`
	SchemaVersion string `json:"schema_version"`
	ServerID      string `json:"server_id"`
	ServerVersion string `json:"server_version,omitempty"`
	Tools         []Tool `json:"tools"`
	// Prompts and Resources are the server's prompts and resources Talos
	// decides like tools (prompts/get, resources/read). Names are one
	// namespace with the tools' names.
	Prompts   []Prompt   `json:"prompts,omitempty"`
	Resources []Resource `json:"resources,omitempty"`
}

// Exposure is the trust and exposure metadata a prompt or resource
// shares with a tool (CSP MUST 1, CM-TRUST, CM-SUBAGENT).
type Exposure struct {
	TrustLevel       string `json:"trust_level,omitempty"`
	RiskCategory     string `json:"risk_category,omitempty"`
	SubagentAccess   string `json:"subagent_access,omitempty"`
	RequiresApproval *bool  `json:"requires_approval,omitempty"`
}

// Prompt is one prompt of a server's manifest: prompts/get of Name is
// decided like a read tool of that name whose arguments are the prompt's.
type Prompt struct {
	Name string `json:"name"`
	Exposure
	MaxArgsBytes *int64 `json:"max_args_bytes,omitempty"`
}

// Resource is one resource of a server's manifest: a resources/read of a
// URI that URI (an RFC 6570 template, or a URI matching only itself)
// matches is decided like a read tool named Name.
type Resource struct {
	Name string `json:"name"`
	URI  string `json:"uri"`
	Exposure
	NetworkOutbound *bool `json:"network_outbound,omitempty"`
}

// Tool classes.
const (
	ClassRead  = "read"
	ClassWrite = "write"
)

// Content encodings of document operations.
const (
	EncodingUTF8   = "utf8"
	EncodingBase64 = "base64"
)

// Document size defaults (REG 9.2.0): 10 MB read, 5 MB write, 50 MB batch.
const (
	DefaultMaxReadBytes  int64 = 10 * 1024 * 1024
	DefaultMaxWriteBytes int64 = 5 * 1024 * 1024
	DefaultMaxBatchBytes int64 = 50 * 1024 * 1024
)

// Tool is one registry entry. Fields after DocumentSpec are the optional
// per-tool metadata of CSP MUST 1 and MUST 7 and of CM-TRUST, CM-EGRESS,
// CM-BUILTIN, CM-SUBAGENT and CM-ACTIONS.
type Tool struct {
	ToolName     string        `json:"tool_name"`
	ToolClass    string        `json:"tool_class"`
	IsDocumentOp bool          `json:"is_document_op"`
	DocumentSpec *DocumentSpec `json:"document_spec,omitempty"`

	TrustLevel      string `json:"trust_level,omitempty"`   // internal|verified|community|unknown
	RiskCategory    string `json:"risk_category,omitempty"` // LOW|MEDIUM|HIGH|CRITICAL
	NetworkOutbound *bool  `json:"network_outbound,omitempty"`
	BuiltIn         *bool  `json:"built_in,omitempty"`
	SubagentAccess  string `json:"subagent_access,omitempty"` // full|read_only|denied
	// RequiresApproval overrides the trust level's default (community and
	// unknown need a human approval; see enforce.RequiresApproval).
	RequiresApproval *bool           `json:"requires_approval,omitempty"`
	ActionPointer    string          `json:"action_pointer,omitempty"`
	Actions          []Action        `json:"actions,omitempty"`
	InputSchema      json.RawMessage `json:"input_schema,omitempty"`

	// Flight recorder metadata (UTS FR-EVT-007); see the Effective*
	// helpers for the defaults.
	ToolVersion string `json:"tool_version,omitempty"`
	SideEffect  string `json:"side_effect,omitempty"` // READ|WRITE|EXECUTE
	Idempotency string `json:"idempotency,omitempty"` // IDEMPOTENT|IDEMPOTENT_WITH_KEY|NON_IDEMPOTENT

	// ResourcePointer locates, in request.arguments, the string a
	// capability scope's resource:<pattern> is matched against (CP-SCOPE).
	ResourcePointer string `json:"resource_pointer,omitempty"`
	// PathPointers locate path arguments that must stay inside
	// WorkspaceRoot (preflight, CSP MUST 7, VAL-03): an absolute path, or
	// WorkspaceFromEnforcementPoint.
	PathPointers  []string `json:"path_pointers,omitempty"`
	WorkspaceRoot string   `json:"workspace_root,omitempty"`
	// MaxArgsBytes caps the JCS size of request.arguments; nil means the
	// worker's default.
	MaxArgsBytes *int64 `json:"max_args_bytes,omitempty"`
	// DefinitionSHA256 pins the tool's definition as its server lists it
	// (enforce.DefinitionDrift; OWASP MCP03): hex sha256 of the RFC 8785
	// form of {name, description, inputSchema, annotations}.
	DefinitionSHA256 string `json:"definition_sha256,omitempty"`
}

// WorkspaceFromEnforcementPoint is the workspace_root of a tool whose path
// arguments are confined to the workspace the enforcement point serves for
// the server (the call envelope's workspace_root), so one manifest fits
// every deployment (CSP MUST 7).
const WorkspaceFromEnforcementPoint = "enforcement_point"

// Side effects and idempotency classes of UTS 6.0.2.3.
const (
	SideEffectRead    = "READ"
	SideEffectWrite   = "WRITE"
	SideEffectExecute = "EXECUTE"

	IdempotencyIdempotent    = "IDEMPOTENT"
	IdempotencyWithKey       = "IDEMPOTENT_WITH_KEY"
	IdempotencyNonIdempotent = "NON_IDEMPOTENT"
)

// EffectiveSideEffect is t.SideEffect, or READ/WRITE from class (the
// effective class of the call: an action's class for action-based tools).
func (t *Tool) EffectiveSideEffect(class string) string {
	if t.SideEffect != "" {
		return t.SideEffect
	}
	if class == ClassRead {
		return SideEffectRead
	}
	return SideEffectWrite
}

// EffectiveIdempotency is t.Idempotency, or IDEMPOTENT for reads and
// IDEMPOTENT_WITH_KEY for writes.
func (t *Tool) EffectiveIdempotency(class string) string {
	if t.Idempotency != "" {
		return t.Idempotency
	}
	if class == ClassRead {
		return IdempotencyIdempotent
	}
	return IdempotencyWithKey
}

// DocumentSpec says where a document operation's content lives and its limits.
type DocumentSpec struct {
	ContentEncoding      string   `json:"content_encoding"`
	WriteContentPointers []string `json:"write_content_pointers,omitempty"`
	ReadContentPointers  []string `json:"read_content_pointers,omitempty"`
	MaxReadBytes         *int64   `json:"max_read_bytes,omitempty"`
	MaxWriteBytes        *int64   `json:"max_write_bytes,omitempty"`
	MaxBatchBytes        *int64   `json:"max_batch_bytes,omitempty"`
}

// Action is one action of an action-based tool; the call's class is the action's.
type Action struct {
	Name     string `json:"name"`
	ReadOnly bool   `json:"read_only"`
}
