package schemas

import "encoding/json"

// Decision is the reply a worker publishes on talos.decision.<ep_id>.<phase>.<call>
// (schemas/talos/decision.schema.json).
type Decision struct {
	ToolCallID     string          `json:"tool_call_id"`
	Phase          string          `json:"phase"`
	Decision       string          `json:"decision"`
	ReasonCodes    []string        `json:"reason_codes"`
	ReceiptID      string          `json:"receipt_id"`
	RegistryDigest string          `json:"registry_digest"`
	Receipt        json.RawMessage `json:"receipt"`
	// Details explain a deny for humans (schema paths, pointer names); never values.
	Details []string `json:"details,omitempty"`
}
