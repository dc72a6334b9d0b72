package schemas

import (
	"fmt"
	"regexp"
)

// Stream names (DESIGN.md §3).
const (
	StreamCalls   = "TALOS_CALLS"
	StreamAudit   = "TALOS_AUDIT"
	StreamControl = "TALOS_CONTROL"
)

// Subject roots and wildcards.
const (
	SubjectCallsAll   = "talos.call.>"
	SubjectAuditAll   = "talos.audit.>"
	SubjectControlAll = "talos.control.>"
	SubjectCall       = "talos.call." // talos.call.<phase>.<server_id>
	SubjectCallPre    = "talos.call.pre."
	SubjectCallPost   = "talos.call.post."
	SubjectControl    = "talos.control." // talos.control.<verb>
	SubjectDecision   = "talos.decision."
	SubjectStatus     = "talos.status."
	SubjectCtl        = "talos.ctl."

	// TALOS_AUDIT subject prefixes (ReceiptSubject, ToolCallEventSubject,
	// CheckpointSubject): the sink routes records on them.
	SubjectReceipt    = "talos.audit.receipt."    // talos.audit.receipt.<kind>.<server_id or verb>
	SubjectToolCall   = "talos.audit.toolcall."   // talos.audit.toolcall.<server_id>
	SubjectCheckpoint = "talos.audit.checkpoint." // talos.audit.checkpoint.<chain_id>
)

// Phases of a tool call.
const (
	PhasePre  = "pre"
	PhasePost = "post"
)

// Receipt kinds (the <kind> token of talos.audit.receipt.<kind>.<server_id>).
const (
	KindDecision = "decision"
	KindEffect   = "effect"
	KindControl  = "control"
)

// IDPattern is what server_id and ep_id must match so they are safe subject tokens.
var IDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// ValidID reports whether s is a valid server_id or ep_id.
func ValidID(s string) bool { return IDPattern.MatchString(s) }

// CallSubject is the subject an enforcement point publishes a call on.
func CallSubject(phase, serverID string) string {
	return SubjectCall + phase + "." + serverID
}

// DecisionSubject is the core-NATS subject an enforcement point listens on.
func DecisionSubject(epID string) string { return SubjectDecision + epID }

// ReceiptSubject is the TALOS_AUDIT subject of a receipt; for control receipts
// the last token is the verb.
func ReceiptSubject(kind, serverOrVerb string) string {
	return SubjectReceipt + kind + "." + serverOrVerb
}

// ToolCallEventSubject is the TALOS_AUDIT subject of a ToolCallEvent.
func ToolCallEventSubject(serverID string) string { return SubjectToolCall + serverID }

// CheckpointSubject is the TALOS_AUDIT subject of a chain checkpoint.
func CheckpointSubject(chainID string) string { return SubjectCheckpoint + chainID }

// CheckpointMsgID is the Nats-Msg-Id of a chain's checkpoint n, so that a
// retried publish is stored once.
func CheckpointMsgID(chainID string, n uint64) string {
	return fmt.Sprintf("checkpoint:%s:%d", chainID, n)
}

// CallMsgID is the Nats-Msg-Id an enforcement point sets when it publishes a call.
func CallMsgID(toolCallID, phase string) string { return toolCallID + ":" + phase }

// AuditMsgID is the Nats-Msg-Id of an audit record: one per call, phase and
// kind, so that a redelivered call cannot store a second receipt.
func AuditMsgID(toolCallID, phase, kind string) string {
	return fmt.Sprintf("%s:%s:%s", toolCallID, phase, kind)
}

// AuditRecord is one message of TALOS_AUDIT as the sink hands it to the
// projection: its subject, its exact bytes, and its stream sequence.
type AuditRecord struct {
	Subject   string
	Data      []byte
	StreamSeq uint64
}
