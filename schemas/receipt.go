package schemas

// Receipt is the data of a signed receipt CloudEvent
// (schemas/talos/receipt.schema.json). The first block carries the signed
// audit fields of CP-SFC; the rest is Talos's. Signature covers the whole
// CloudEvent with data.signature removed (DESIGN.md §3).
type Receipt struct {
	// CP-SFC audit event fields.
	EventType      string `json:"event_type"` // decision | effect | control
	Tool           string `json:"tool"`       // tool name (control: the verb)
	CapabilityHash string `json:"capability_hash"`
	RequestHash    string `json:"request_hash"`
	ResponseHash   string `json:"response_hash"`
	AgentID        string `json:"agent_id"`
	ToolID         string `json:"tool_id"` // <server_id>/<tool_name>
	Timestamp      string `json:"timestamp"`
	ResultCode     string `json:"result_code"` // the decision, or the first reason code of a deny

	// EnvelopeHash is sha256 of the envelope bytes exactly as received (also
	// for malformed envelopes, where it is the only trace of the content).
	EnvelopeHash string `json:"envelope_hash"`

	ToolCallID    string `json:"tool_call_id"`
	TraceID       string `json:"trace_id"`
	CorrelationID string `json:"correlation_id"`
	SessionID     string `json:"session_id"`
	EPID          string `json:"ep_id"`
	ServerID      string `json:"server_id"`
	ToolName      string `json:"tool_name"`
	// MCPMethod is the envelope's mcp_method: what ToolName names when
	// the call is not a tools/call ("" for one).
	MCPMethod string `json:"mcp_method,omitempty"`
	// ParentToolCallID is the envelope's: the call during which a server
	// made this request of its client.
	ParentToolCallID string         `json:"parent_tool_call_id,omitempty"`
	Phase            string         `json:"phase"`
	Mode             string         `json:"mode"` // prod | dev
	Decision         string         `json:"decision"`
	ReasonCodes      []string       `json:"reason_codes"`
	ToolClass        string         `json:"tool_class"`
	RegistryDigest   string         `json:"registry_digest"`
	DocumentHashes   []DocumentHash `json:"document_hashes"`
	BatchTotalBytes  int64          `json:"batch_total_bytes"`
	ContentHashAlg   string         `json:"content_hash_alg"`
	Effect           *ToolEffect    `json:"effect,omitempty"`
	// CapabilityIDs are the capability ids of the verified chain, root
	// first (DESIGN.md §3); empty when the call carried no valid capability.
	CapabilityIDs []string `json:"capability_ids,omitempty"`
	// IdempotentOf names the earlier call whose idempotency key and request
	// this allowed call repeats; the decision is that call's.
	IdempotentOf *IdempotentOf `json:"idempotent_of,omitempty"`
	// ControlSeq is the TALOS_CONTROL sequence whose state (kill switches,
	// quarantines, registry pin) the decision was made under; 0 (omitted)
	// means no control event had been applied.
	ControlSeq uint64 `json:"control_seq,omitempty"`
	// TokenHandling is copied from the envelope (mode none when it has
	// none) on the decision and effect receipts of valid envelopes (CSP
	// MUST 5, CRED-03).
	TokenHandling *TokenHandling `json:"token_handling,omitempty"`
	// UpstreamSandbox is copied from the envelope, when it has one, on the
	// decision and effect receipts of valid envelopes (CSP MUST 8).
	UpstreamSandbox *UpstreamSandbox `json:"upstream_sandbox,omitempty"`
	// Control is the command record of a control receipt (event_type control).
	Control *ControlRecord `json:"control,omitempty"`

	Chain     Chain      `json:"chain"`
	Signature *Signature `json:"signature,omitempty"`
}

// IdempotentOf is the earlier call an idempotent retry repeats.
type IdempotentOf struct {
	ToolCallID string `json:"tool_call_id"`
	ReceiptID  string `json:"receipt_id,omitempty"` // "" while that call's receipt was not yet recorded
}

// DocumentHash is the sha256 of one document's preimage bytes (REG 9.2-I3).
type DocumentHash struct {
	Pointer   string `json:"pointer"`
	Hash      string `json:"hash"`
	SizeBytes int64  `json:"size_bytes"`
}

// ToolEffect is what a tool did, hashed after execution
// (schemas/talos/tool_effect.schema.json; REG 9.2.3).
type ToolEffect struct {
	EffectID        string         `json:"effect_id"` // strict UUIDv7
	ToolCallID      string         `json:"tool_call_id"`
	DocumentHashes  []DocumentHash `json:"document_hashes"`
	BatchTotalBytes int64          `json:"batch_total_bytes"`
	ContentHashAlg  string         `json:"content_hash_alg"`
}

// Chain places a receipt in its signer's hash chain. Seq starts at 1 with
// no gaps; PrevHash is the receipt hash of seq-1 (64 zeros for seq 1).
type Chain struct {
	ChainID  string `json:"chain_id"`
	Seq      uint64 `json:"seq"`
	PrevHash string `json:"prev_hash"`
}

// GenesisHash is the prev_hash of the first link of every chain.
const GenesisHash = "0000000000000000000000000000000000000000000000000000000000000000"

// Signature is data.signature of a signed CloudEvent.
type Signature struct {
	Alg string `json:"alg"` // Ed25519
	KID string `json:"kid"`
	Sig string `json:"sig"` // base64url, no padding
}
