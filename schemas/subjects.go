package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// Stream names (DESIGN.md §3).
const (
	StreamCalls   = "TALOS_CALLS"
	StreamAudit   = "TALOS_AUDIT"
	StreamControl = "TALOS_CONTROL"
	// StreamDecisions keeps each decision reply for a while, so that an
	// enforcement point that missed it can ask again (DecisionSubject).
	StreamDecisions = "TALOS_DECISIONS"
)

// Subject roots and wildcards.
const (
	SubjectCallsAll   = "talos.call.>"
	SubjectAuditAll   = "talos.audit.>"
	SubjectControlAll = "talos.control.>"
	// SubjectDecisionsAll is every decision reply (TALOS_DECISIONS).
	SubjectDecisionsAll = "talos.decision.>"
	SubjectCall         = "talos.call." // talos.call.<phase>.<ep_id>.<server_id>
	SubjectCallPre      = "talos.call.pre."
	SubjectCallPost     = "talos.call.post."
	SubjectControl      = "talos.control." // talos.control.<verb>
	SubjectDecision     = "talos.decision."
	SubjectStatus       = "talos.status."
	SubjectCtl          = "talos.ctl."

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

// ValidID reports whether s is a valid server_id or ep_id: whether it
// matches IDPattern. It is checked several times per call, so it is the
// pattern written out rather than run through the regexp engine.
func ValidID(s string) bool {
	if s == "" || len(s) > 64 || !idStart(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !idStart(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// idStart reports whether c may begin an id: [a-z0-9].
func idStart(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

// CallSubject is the subject enforcement point epID publishes a call on:
// talos.call.<phase>.<ep_id>.<server_id>. NATS lets the enforcement role's
// user ep-<ep_id> publish only subjects of its own ep_id (EPCallSubjects),
// so the subject names the authenticated publisher, whatever the envelope
// says.
func CallSubject(phase, epID, serverID string) string {
	return SubjectCall + phase + "." + epID + "." + serverID
}

// EPCallSubjects matches every call subject of enforcement point epID
// (talos.call.*.<ep_id>.*): what its NATS user may publish.
func EPCallSubjects(epID string) string { return SubjectCall + "*." + epID + ".*" }

// ParseCallSubject reads talos.call.<phase>.<ep_id>.<server_id>. ok is
// false unless the subject has exactly these tokens, the phase is pre or
// post and both ids are valid; the parts it could read are returned anyway
// ("" for an id that is not valid), phase defaulting to pre.
func ParseCallSubject(subject string) (phase, epID, serverID string, ok bool) {
	phase = PhasePre
	rest, found := strings.CutPrefix(subject, SubjectCall)
	if !found {
		return phase, "", "", false
	}
	tokens := strings.Split(rest, ".")
	if tokens[0] == PhasePost {
		phase = PhasePost
	}
	if len(tokens) != 3 {
		return phase, "", "", false
	}
	if ValidID(tokens[1]) {
		epID = tokens[1]
	}
	if ValidID(tokens[2]) {
		serverID = tokens[2]
	}
	return phase, epID, serverID, (tokens[0] == PhasePre || tokens[0] == PhasePost) && epID != "" && serverID != ""
}

// EPCallID names a call as the enforcement point that published it names
// it: "<ep_id>:<tool_call_id>". Enforcement points choose their own
// tool_call_ids, so two may use the same one: every key that must tell
// calls apart (the Nats-Msg-Ids of TALOS_CALLS and TALOS_AUDIT, the call
// ledger, the target of an approval) carries the ep_id too.
func EPCallID(epID, toolCallID string) string { return epID + ":" + toolCallID }

// ParseApprovalTarget reads the target of an approve or reject: a
// tool_call_id (a UUID in its 36-character form), or "<ep_id>:<tool_call_id>"
// (EPCallID). epID is "" when the target names none.
func ParseApprovalTarget(target string) (epID, toolCallID string, ok bool) {
	epID, toolCallID, qualified := strings.Cut(target, ":")
	if !qualified {
		epID, toolCallID = "", target
	} else if !ValidID(epID) {
		return "", "", false
	}
	if !uuidPattern.MatchString(toolCallID) {
		return "", "", false
	}
	return epID, toolCallID, true
}

// DecisionSubject is the subject of one call's decision reply:
// talos.decision.<ep_id>.<phase>.<call>, call its tool_call_id (or, for
// an envelope without a usable one, calls-seq-<TALOS_CALLS sequence>). Its
// enforcement point listens on DecisionSubjects live, and TALOS_DECISIONS
// keeps the last reply of each subject for it to ask again
// (DecisionGetSubject).
func DecisionSubject(epID, phase, call string) string {
	return SubjectDecision + epID + "." + phase + "." + call
}

// DecisionSubjects matches every decision reply to enforcement point epID
// (talos.decision.<ep_id>.>): what its NATS user may subscribe to.
func DecisionSubjects(epID string) string { return SubjectDecision + epID + ".>" }

// directGet is the JetStream API subject prefix of a direct get of a
// TALOS_DECISIONS subject's last message, the subject appended.
const directGet = "$JS.API.DIRECT.GET." + StreamDecisions + "."

// DecisionGetSubject is the request that asks TALOS_DECISIONS again for
// one call's decision reply: a JetStream direct get of the last message on
// DecisionSubject(epID, phase, call), answered by any replica of the
// stream (a follower may not have it yet: ask again).
func DecisionGetSubject(epID, phase, call string) string {
	return directGet + DecisionSubject(epID, phase, call)
}

// DecisionGetSubjects matches every DecisionGetSubject of enforcement
// point epID: its NATS user may ask for its own calls' decisions only.
func DecisionGetSubjects(epID string) string { return directGet + DecisionSubjects(epID) }

// SafeToken reports whether s may be one token of a subject: 1 to 128
// letters, digits, '-' or '_' (a tool_call_id is a UUID).
func SafeToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

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

// CallMsgID is the Nats-Msg-Id enforcement point epID sets when it
// publishes the envelope raw: <ep_id>:<tool_call_id>:<phase>:<digest>,
// digest the first 16 hex digits of sha256(raw). A retry of the same
// bytes is the stream's duplicate; nobody else can make one in advance:
// NATS lets any publisher set any header, and an envelope's bytes (its
// random correlation_id, its signature) are not known before it is sent.
func CallMsgID(epID, toolCallID, phase string, raw []byte) string {
	sum := sha256.Sum256(raw)
	return EPCallID(epID, toolCallID) + ":" + phase + ":" + hex.EncodeToString(sum[:8])
}

// AuditMsgID is the Nats-Msg-Id of an audit record: one per call, phase and
// kind, so that a redelivered call cannot store a second receipt. callID is
// the call's EPCallID, or calls-seq-<n> for an envelope whose ids are not
// trusted.
func AuditMsgID(callID, phase, kind string) string {
	return fmt.Sprintf("%s:%s:%s", callID, phase, kind)
}

// AuditRecord is one message of TALOS_AUDIT as the sink hands it to the
// projection: its subject, its exact bytes, and its stream sequence.
type AuditRecord struct {
	Subject   string
	Data      []byte
	StreamSeq uint64
}
