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

	CodeDenyUnknownFields   = "DENY_UNKNOWN_FIELDS"
	CodeDenyPayloadTooLarge = "DENY_PAYLOAD_TOO_LARGE"
	CodeDenyPathTraversal   = "DENY_PATH_TRAVERSAL"
	CodeDenyRateLimit       = "DENY_RATE_LIMIT"
	CodeDenyNoMatchingRule  = "DENY_NO_MATCHING_RULE"
	// CodeDenySchemaViolation: the arguments break the tool's registry
	// input_schema other than by an unknown field (seed 003 MUST 7 "schema
	// validation"; the seed names no code for it).
	CodeDenySchemaViolation = "DENY_SCHEMA_VIOLATION"
)

// WarningCodes are codes that may accompany an allow.
var WarningCodes = map[string]bool{CodeToolUnclassifiedAllowedDev: true}
