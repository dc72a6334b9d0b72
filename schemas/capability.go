package schemas

// Capabilities (CP-SSR; schemas/talos/capability.schema.json).
//
// Every signed object carries a "type" member naming what it is, and its
// signature covers sha256(JCS(object without "signature")): a signature
// made for one object type cannot verify as another (context confusion).
// Signatures are Ed25519, base64url without padding, in a Signature
// {alg, kid, sig} where kid is verify.KeyID of the signing key.

// Signed object types.
const (
	CapabilityTypeV1      = "talos.capability.v1"
	DelegationTypeV1      = "talos.delegation.v1"
	EnvelopeSignatureV1   = "talos.envelope_signature.v1"
	MaxDelegationDepth    = 3
	CapabilitySkewSeconds = 60
	// MethodToolsCall is the MCP method an envelope's sender signature
	// names for every tools/call (ToolCall.Method).
	MethodToolsCall = "tools/call"
	// MethodPromptsGet and MethodResourcesRead are the other MCP requests
	// Talos decides (an envelope's mcp_method).
	MethodPromptsGet    = "prompts/get"
	MethodResourcesRead = "resources/read"
	// MethodSamplingCreateMessage, MethodElicitationCreate and
	// MethodRootsList are the requests a server makes of its client that
	// Talos records (IsServerRequest).
	MethodSamplingCreateMessage = "sampling/createMessage"
	MethodElicitationCreate     = "elicitation/create"
	MethodRootsList             = "roots/list"
)

// Capability is a capability a trusted issuer signed for one subject
// (agent). Scopes use the CP-SCOPE grammar
// tool:<server_id>:<tool_name>[/method:<action>][/resource:<pattern>].
type Capability struct {
	Type             string       `json:"type"`
	CapabilityID     string       `json:"capability_id"`
	Issuer           string       `json:"issuer"`
	Subject          string       `json:"subject"`
	SubjectPublicKey string       `json:"subject_public_key"` // base64url Ed25519 public key
	Scopes           []string     `json:"scopes"`
	Constraints      *Constraints `json:"constraints,omitempty"`
	IssuedAt         string       `json:"issued_at"`
	ExpiresAt        string       `json:"expires_at"`
	Signature        *Signature   `json:"signature,omitempty"`
}

// Constraints narrow what a capability allows.
type Constraints struct {
	ReadOnly bool `json:"read_only,omitempty"`
}

// Delegation hands a narrower capability from its holder (delegator) to
// another agent (delegatee). The delegator signs it with the key its parent
// names (the capability's subject_public_key, or the previous delegation's
// delegatee_public_key).
type Delegation struct {
	Type                 string       `json:"type"`
	CapabilityID         string       `json:"capability_id"`
	ParentCapabilityHash string       `json:"parent_capability_hash"` // hex sha256(JCS(parent, signature included))
	ChildScope           []string     `json:"child_scope"`
	Constraints          *Constraints `json:"constraints,omitempty"`
	IssuedAt             string       `json:"issued_at"`
	ExpiresAt            string       `json:"expires_at"`
	DelegatorID          string       `json:"delegator_id"`
	DelegateeID          string       `json:"delegatee_id"`
	DelegateePublicKey   string       `json:"delegatee_public_key"`
	Signature            *Signature   `json:"signature,omitempty"`
}

// CapabilityChain is the envelope's "capability" member: a root capability
// and up to MaxDelegationDepth delegations, each narrowing the one before.
// The holder is the last delegation's delegatee (or the root's subject).
type CapabilityChain struct {
	Capability  Capability   `json:"capability"`
	Delegations []Delegation `json:"delegations,omitempty"`
}

// EnvelopeSignedFields is what an envelope's sender_signature signs (CP-SFC):
// sha256(JCS(this)), by the chain holder's key. CapabilityHash is
// hex sha256(JCS(envelope.capability)); RequestHash is the envelope's
// request_hash (sha256(JCS(request))); Timestamp is its issued_at.
type EnvelopeSignedFields struct {
	Type           string `json:"type"` // EnvelopeSignatureV1
	CorrelationID  string `json:"correlation_id"`
	CapabilityHash string `json:"capability_hash"`
	RequestHash    string `json:"request_hash"`
	Tool           string `json:"tool"`   // <server_id>:<tool_name>
	Method         string `json:"method"` // MethodToolsCall
	Timestamp      string `json:"timestamp"`
	SessionID      string `json:"session_id"`
}
