package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// CallLedger remembers, across every worker, what phase pre decided: the
// idempotency keys allowed calls used (IDEMPOTENCY_KEY_REUSED) and each
// call's pre decision (so a post event can be matched to it). Errors mean
// the ledger could not answer; the caller then has no decision (fail
// closed: the call is retried).
type CallLedger interface {
	// ClaimIdempotency claims key for rec. If another call holds it, it
	// returns that holder's record and claimed=false.
	ClaimIdempotency(key string, rec IdemRecord) (held IdemRecord, claimed bool, err error)
	// SetIdempotencyReceipt records the receipt id of the call holding key.
	SetIdempotencyReceipt(key string, rec IdemRecord) error
	// RecordPre stores a call's pre decision.
	RecordPre(toolCallID string, rec PreRecord) error
	// LookupPre finds a call's pre decision.
	LookupPre(toolCallID string) (rec PreRecord, found bool, err error)
}

// IdemRecord is who holds an idempotency key.
type IdemRecord struct {
	RequestHash string `json:"request_hash"`
	ToolCallID  string `json:"tool_call_id"`
	ReceiptID   string `json:"receipt_id,omitempty"`
}

// PreRecord is a call's phase-pre decision.
type PreRecord struct {
	Decision      string   `json:"decision"`
	ReceiptID     string   `json:"receipt_id"`
	CapabilityIDs []string `json:"capability_ids,omitempty"`
	DecidedAt     string   `json:"decided_at"`
}

// IdempotencyKey is the ledger key of (agent, server, tool,
// idempotency_key): hex sha256 over the length-prefixed parts, so no two
// tuples share a key.
func IdempotencyKey(agent, server, tool, key string) string {
	h := sha256.New()
	for _, p := range []string{agent, server, tool, key} {
		h.Write([]byte(strconv.Itoa(len(p))))
		h.Write([]byte{':'})
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil))
}
