package schemas

// Decisions.
const (
	DecisionAllow           = "allow"
	DecisionDeny            = "deny"
	DecisionRequireApproval = "require_approval"
)

// Stable reason codes (DESIGN.md §3). An allow may carry warning codes.
const (
	CodeEnvelopeInvalid = "VAL-HTC-001"

	CodeToolUnclassifiedDenied       = "TOOL_UNCLASSIFIED_DENIED"
	CodeUnknownTool                  = "UNKNOWN_TOOL"
	CodeToolUnclassifiedAllowedDev   = "TOOL_UNCLASSIFIED_ALLOWED_DEV"
	CodeToolClassMismatch            = "TOOL_CLASS_MISMATCH"
	CodeToolClassDeclarationMismatch = "TOOL_CLASS_DECLARATION_MISMATCH"
	CodeDocSizeExceeded              = "DOC_SIZE_EXCEEDED"
	CodeDocHashMismatch              = "DOC_HASH_MISMATCH"
	CodeDocContentPointerInvalid     = "DOC_CONTENT_POINTER_INVALID"
	CodeDocEncodingInvalid           = "DOC_ENCODING_INVALID"
	CodeIdempotencyKeyRequired       = "IDEMPOTENCY_KEY_REQUIRED"
	CodeIdempotencyKeyReused         = "IDEMPOTENCY_KEY_REUSED"
	CodeRegistryVersionMismatch      = "REGISTRY_VERSION_MISMATCH"

	CodeNoCapability        = "NO_CAPABILITY"
	CodeExpired             = "EXPIRED"
	CodeRevoked             = "REVOKED"
	CodeScopeMismatch       = "SCOPE_MISMATCH"
	CodeDelegationInvalid   = "DELEGATION_INVALID"
	CodeReplay              = "REPLAY"
	CodeSignatureInvalid    = "SIGNATURE_INVALID"
	CodeRequestHashMismatch = "REQUEST_HASH_MISMATCH"

	CodeKillSwitch         = "KILL_SWITCH"
	CodeSessionQuarantined = "SESSION_QUARANTINED"

	// Tool trust and exposure (CSP MUST 4; CM-TRUST, CM-BUILTIN, CM-EGRESS,
	// CM-SUBAGENT).
	//
	// CodeApprovalRequired makes the decision require_approval when every
	// other code is a warning: the tool's server is community/unknown
	// trust (or the registry says requires_approval). The enforcement point
	// parks the call until `talosctl approve|reject` or its timeout.
	CodeApprovalRequired = "APPROVAL_REQUIRED"
	// CodeToolShadowed: the tool's name is held by a built_in or internal
	// tool of another server, which this one may not shadow.
	CodeToolShadowed = "TOOL_SHADOWED"
	// CodeNetworkOutboundBlocked: a network_outbound tool while the
	// exfiltration guard blocks them (kill-switch scope egress:..., or the
	// gateway's --block-network-outbound).
	CodeNetworkOutboundBlocked = "NETWORK_OUTBOUND_BLOCKED"
	// CodeSubagentDenied: a delegated capability (a subagent) calls a tool
	// whose registry subagent_access is denied.
	CodeSubagentDenied = "SUBAGENT_ACCESS_DENIED"

	// Enforcement-point codes: an enforcement point denies with these on
	// its own, and reports them in the post event's error.code.
	//
	// CodeDecisionTimeout: no decision within the timeout (fail closed).
	CodeDecisionTimeout = "DECISION_TIMEOUT"
	// CodeEnforcementUnavailable: the enforcement point has no connection
	// to NATS, so it cannot ask (fail closed).
	CodeEnforcementUnavailable = "ENFORCEMENT_UNAVAILABLE"
	// CodeApprovalRejected: a responder rejected the parked call.
	CodeApprovalRejected = "APPROVAL_REJECTED"
	// CodeApprovalTimeout: nobody approved the parked call in time.
	CodeApprovalTimeout = "APPROVAL_TIMEOUT"
	// CodeToolHidden: the tool (or action) is not offered to this caller
	// (identity-bound discovery) and was called anyway.
	CodeToolHidden = "TOOL_HIDDEN"

	CodeDenyUnknownFields   = "DENY_UNKNOWN_FIELDS"
	CodeDenyPayloadTooLarge = "DENY_PAYLOAD_TOO_LARGE"
	CodeDenyPathTraversal   = "DENY_PATH_TRAVERSAL"
	CodeDenyRateLimit       = "DENY_RATE_LIMIT"
	CodeDenyNoMatchingRule  = "DENY_NO_MATCHING_RULE"
	// CodeDenySchemaViolation: the arguments break the tool's registry
	// input_schema other than by an unknown field (CSP MUST 7 "schema
	// validation"; the specification names no code for it).
	CodeDenySchemaViolation = "DENY_SCHEMA_VIOLATION"
	// CodeDenyUnauthenticated: an enforcement point refused a request that
	// carried no valid credentials (CSP MUST 2, AUTH-01, AUTH-02) and
	// reported the attempt on ServerUnauthenticated; the worker denies it
	// with this code alone, so the refusal has a signed receipt.
	CodeDenyUnauthenticated = "DENY_UNAUTHENTICATED"
	// CodeDenyTokenPassthrough: the credential the enforcement point would
	// send the upstream equals the client's own token (CSP MUST 5,
	// CRED-02); its envelope says token_handling.passthrough_detected.
	CodeDenyTokenPassthrough = "DENY_TOKEN_PASSTHROUGH"
	// CodeDenyCredentialUnavailable: the enforcement point could not obtain
	// the upstream credential (token endpoint down or refusing, no JWT to
	// exchange); its envelope says token_handling.error (fail closed).
	CodeDenyCredentialUnavailable = "DENY_CREDENTIAL_UNAVAILABLE"
	// CodeDenyToolDrift: the tool's definition as the enforcement point
	// lists it (name, description, inputSchema, annotations) is not the one
	// the registry pins (definition_sha256): a "rug pull", OWASP MCP03.
	CodeDenyToolDrift = "DENY_TOOL_DRIFT"
	// CodeDenyEPIDMismatch: the envelope's ep_id is not the enforcement
	// point that published it, the ep_id token of its subject
	// (talos.call.<phase>.<ep_id>.<server_id>), which NATS binds to the
	// publisher's user. The only code such an envelope gets; its receipt
	// names the publisher, and the publisher is answered.
	CodeDenyEPIDMismatch = "DENY_EP_ID_MISMATCH"
)

// ServerUnauthenticated is the reserved server_id on which an enforcement
// point reports a request it refused for want of valid credentials. No
// tool runs there: every envelope naming it is denied
// (CodeDenyUnauthenticated), so trusting the report can only deny.
const ServerUnauthenticated = "unauthenticated"

// ApprovalCodes are codes that, with warnings only, make the decision
// require_approval rather than deny.
var ApprovalCodes = map[string]bool{CodeApprovalRequired: true}

// WarningCodes are codes that may accompany an allow.
var WarningCodes = map[string]bool{CodeToolUnclassifiedAllowedDev: true}
