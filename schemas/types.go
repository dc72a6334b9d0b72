package schemas

// CloudEvent type names (DESIGN.md §3).
const (
	TypeReceiptDecision = "dev.talos.receipt.decision.v1"
	TypeReceiptEffect   = "dev.talos.receipt.effect.v1"
	TypeReceiptControl  = "dev.talos.receipt.control.v1"
	TypeToolCall        = "dev.talos.toolcall.v1"
	TypeCheckpoint      = "dev.talos.checkpoint.v1"
)

// ReceiptType maps a receipt kind to its CloudEvent type.
func ReceiptType(kind string) string {
	switch kind {
	case KindDecision:
		return TypeReceiptDecision
	case KindEffect:
		return TypeReceiptEffect
	case KindControl:
		return TypeReceiptControl
	}
	return ""
}

// Schema versions carried in documents.
const (
	ToolCallSchemaVersion = "talos.tool_call.v1"
	RegistrySchemaID      = "talos.mcp.tool_registry"
	RegistrySchemaVersion = "v1"
	ContentHashAlg        = "sha256"
	SignatureAlg          = "Ed25519"
)

// TimeFormat is RFC 3339 with milliseconds; Talos writes all times in UTC.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"
