package schemas

import "encoding/json"

// Manifest is one server's tool registry manifest
// (schemas/mcp/tool_registry.schema.json, seed 000 §9.2.0).
type Manifest struct {
	SchemaID      string `json:"schema_id"`
	SchemaVersion string `json:"schema_version"`
	ServerID      string `json:"server_id"`
	ServerVersion string `json:"server_version,omitempty"`
	Tools         []Tool `json:"tools"`
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

// Document size defaults (seed 000): 10 MB read, 5 MB write, 50 MB batch.
const (
	DefaultMaxReadBytes  int64 = 10 * 1024 * 1024
	DefaultMaxWriteBytes int64 = 5 * 1024 * 1024
	DefaultMaxBatchBytes int64 = 50 * 1024 * 1024
)

// Tool is one registry entry. Fields after DocumentSpec are the optional
// per-tool metadata of seeds 003/004.
type Tool struct {
	ToolName     string        `json:"tool_name"`
	ToolClass    string        `json:"tool_class"`
	IsDocumentOp bool          `json:"is_document_op"`
	DocumentSpec *DocumentSpec `json:"document_spec,omitempty"`

	TrustLevel      string          `json:"trust_level,omitempty"`   // internal|verified|community|unknown
	RiskCategory    string          `json:"risk_category,omitempty"` // LOW|MEDIUM|HIGH|CRITICAL
	NetworkOutbound *bool           `json:"network_outbound,omitempty"`
	BuiltIn         *bool           `json:"built_in,omitempty"`
	SubagentAccess  string          `json:"subagent_access,omitempty"` // full|read_only|denied
	ActionPointer   string          `json:"action_pointer,omitempty"`
	Actions         []Action        `json:"actions,omitempty"`
	InputSchema     json.RawMessage `json:"input_schema,omitempty"`
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
