package schemas

import "encoding/json"

// ToolCall is the tool call envelope an enforcement point publishes on
// talos.call.<phase>.<ep_id>.<server_id> (schemas/talos/tool_call.schema.json).
// Unknown top-level fields are rejected by the schema.
type ToolCall struct {
	SchemaVersion string `json:"schema_version"`
	Phase         string `json:"phase"`
	ToolCallID    string `json:"tool_call_id"`
	TraceID       string `json:"trace_id"`
	CorrelationID string `json:"correlation_id"`
	SessionID     string `json:"session_id"`
	EPID          string `json:"ep_id"`
	ServerID      string `json:"server_id"`
	ToolName      string `json:"tool_name"`
	// MCPMethod is the MCP request the call is when it is not a
	// tools/call (MethodPromptsGet, MethodResourcesRead, or a server
	// request: IsServerRequest); "" for one.
	MCPMethod string `json:"mcp_method,omitempty"`
	// ParentToolCallID is a server request's: the call of the same
	// enforcement point during which the server made it.
	ParentToolCallID string  `json:"parent_tool_call_id,omitempty"`
	Transport        string  `json:"transport"`
	Actor            Actor   `json:"actor"`
	Request          Request `json:"request"`
	IssuedAt         string  `json:"issued_at"`

	ToolClass              string          `json:"tool_class,omitempty"`
	IdempotencyKey         string          `json:"idempotency_key,omitempty"`
	RegistryDigest         string          `json:"registry_digest,omitempty"`
	Capability             json.RawMessage `json:"capability,omitempty"`
	RequestHash            string          `json:"request_hash,omitempty"`
	ExpectedDocumentHashes []ExpectedHash  `json:"expected_document_hashes,omitempty"`
	ContentHashAlg         string          `json:"content_hash_alg,omitempty"`
	SenderSignature        json.RawMessage `json:"sender_signature,omitempty"`
	ParentSpanID           string          `json:"parent_span_id,omitempty"`
	// TokenHandling is how the enforcement point obtained the credential
	// it sends the upstream for this call (CSP MUST 5).
	TokenHandling *TokenHandling `json:"token_handling,omitempty"`
	// UpstreamSandbox is how the enforcement point runs the stdio upstream
	// it forwards this call to (CSP MUST 8); absent when it does not say
	// (an HTTP upstream runs elsewhere).
	UpstreamSandbox *UpstreamSandbox `json:"upstream_sandbox,omitempty"`
	// WorkspaceRoot is the workspace the enforcement point serves for
	// ServerID (its configuration): the root of path arguments for registry
	// tools whose workspace_root is WorkspaceFromEnforcementPoint (CSP
	// MUST 7). The enforcement point is trusted for it as it is trusted to
	// forward only allowed calls.
	WorkspaceRoot string `json:"workspace_root,omitempty"`
	// ToolDefinitionSHA256 is the definition of the tool as the enforcement
	// point lists it to its caller, hashed like the registry's
	// definition_sha256 pin; a difference is DENY_TOOL_DRIFT.
	ToolDefinitionSHA256 string `json:"tool_definition_sha256,omitempty"`

	// Phase post only.
	Result json.RawMessage `json:"result,omitempty"`
	OK     *bool           `json:"ok,omitempty"`
	Error  *CallError      `json:"error,omitempty"`
	Timing *Timing         `json:"timing,omitempty"`
}

// Actor is who made the call.
type Actor struct {
	Kind    string `json:"kind"` // human | agent | system
	AgentID string `json:"agent_id,omitempty"`
	ModelID string `json:"model_id,omitempty"`
}

// Method is the MCP method of the call: MCPMethod, else MethodToolsCall.
func (c *ToolCall) Method() string { return MethodOf(c.MCPMethod) }

// IsServerRequest reports whether an envelope's mcp_method is a request
// its server made of the client (sampling, elicitation, roots): recorded
// and checked against the incident state, not classified by the registry.
func IsServerRequest(mcpMethod string) bool {
	return mcpMethod == MethodSamplingCreateMessage || mcpMethod == MethodElicitationCreate || mcpMethod == MethodRootsList
}

// IsMCPMethod reports whether s is a value an envelope's mcp_method may
// have (tools/call is said by its absence).
func IsMCPMethod(s string) bool {
	return s == MethodPromptsGet || s == MethodResourcesRead || IsServerRequest(s)
}

// MethodOf is the MCP method an envelope's mcp_method names: itself, or
// MethodToolsCall when absent.
func MethodOf(mcpMethod string) string {
	if mcpMethod != "" {
		return mcpMethod
	}
	return MethodToolsCall
}

// Request is the MCP tools/call params; for prompts/get its params, for
// resources/read {name: tool_name, arguments: {uri}}.
type Request struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Meta      json.RawMessage `json:"_meta,omitempty"`
}

// ExpectedHash is a document hash the agent expects for a pointer.
type ExpectedHash struct {
	Pointer string `json:"pointer"`
	Hash    string `json:"hash"`
}

// CallError is the error an enforcement point reports in a post event.
type CallError struct {
	Code      string `json:"code"`
	Kind      string `json:"kind"`
	Message   string `json:"message,omitempty"`
	Retryable *bool  `json:"retryable,omitempty"`
}

// Timing is when the tool ran, as seen by the enforcement point.
type Timing struct {
	StartedAt string `json:"started_at"`
	EndedAt   string `json:"ended_at"`
}

// Token handling modes: how an enforcement point obtains the credential it
// sends an upstream server (CSP MUST 5). The client's own token is never
// one of them.
const (
	TokenModeNone          = "none"           // no credential is sent
	TokenModeSecret        = "secret"         // the enforcement point's own secret for that server
	TokenModeTokenExchange = "token_exchange" // RFC 8693: the client's token exchanged for one with the server's audience
)

// The network of a call's upstream (UpstreamSandbox.Network).
const (
	SandboxNetworkNone       = "none"       // sandboxed, with no network at all
	SandboxNetworkAllowlist  = "allowlist"  // sandboxed, reaching its egress allowlist only
	SandboxNetworkUnconfined = "unconfined" // not sandboxed: the host's network
)

// UpstreamSandbox is how the stdio upstream of a call runs (CSP MUST 8,
// SAND-01, SAND-02, NET-01): under the enforcement point's sandbox or not,
// and with what network. AllowlistSHA256 names the egress allowlist
// ("sha256:" and the hex sha256 of its normalised entries, sorted, each
// followed by a newline) when Network is allowlist.
type UpstreamSandbox struct {
	Sandboxed       bool   `json:"sandboxed"`
	Network         string `json:"network"`
	AllowlistSHA256 string `json:"allowlist_sha256,omitempty"`
}

// Why an enforcement point has no credential for a call (TokenHandling.Error).
const (
	TokenErrNoSubjectToken      = "no_subject_token"     // token_exchange, but the caller presented no JWT to exchange
	TokenErrExchangeRefused     = "exchange_refused"     // the token endpoint answered, but not with a token
	TokenErrEndpointUnreachable = "endpoint_unreachable" // the token endpoint did not answer
)

// TokenHandling is how the credential of a call's upstream request was
// obtained (CSP MUST 5, CRED-01..03): its mode, the audience it is bound
// to, and whether the enforcement point found the outbound credential
// equal to the client's own token (a passthrough it refused). It never
// holds a credential.
type TokenHandling struct {
	Mode                string `json:"mode"`
	Audience            string `json:"audience"`
	PassthroughDetected bool   `json:"passthrough_detected"`
	// Error says why no credential could be obtained; the call is denied.
	Error string `json:"error,omitempty"`
}
