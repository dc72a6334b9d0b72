package schemas

import (
	"encoding/json"
	"strings"
)

// Control verbs. A verb is the tail of its request subject
// (talos.ctl.<verb>), of its TALOS_CONTROL subject (talos.control.<verb>)
// and of its receipt subject (talos.audit.receipt.control.<verb>).
const (
	VerbKillSwitchSet   = "killswitch.set"
	VerbKillSwitchClear = "killswitch.clear"
	VerbKillSwitchList  = "killswitch.list"
	VerbQuarantineSet   = "quarantine.set"
	VerbQuarantineClear = "quarantine.clear"
	VerbQuarantineList  = "quarantine.list"
	VerbRevoke          = "revoke"
	VerbRegistryPublish = "registry.publish"
	VerbRegistryPin     = "registry.pin"
	VerbRegistryShow    = "registry.show"
	VerbReplayStats     = "replay.stats"
	VerbReplayCheck     = "replay.check"
	VerbReplayFlush     = "replay.flush"
	VerbStatus          = "status"
	// VerbApprove and VerbReject resolve a call parked for human approval
	// (decision require_approval): the command's Target is its tool_call_id,
	// or <ep_id>:<tool_call_id> (EPCallID) when several enforcement points
	// parked calls with that id; the control receipt's Target is always the
	// latter, naming the one call resolved. The enforcement point that
	// parked it listens on their TALOS_CONTROL subjects (ControlSubject) and
	// runs or denies the call.
	VerbApprove = "approve"
	VerbReject  = "reject"
)

// MutatingVerbs change enforcement state: the control service appends them
// to TALOS_CONTROL and every worker applies them. The other verbs only read.
var MutatingVerbs = map[string]bool{
	VerbKillSwitchSet: true, VerbKillSwitchClear: true,
	VerbQuarantineSet: true, VerbQuarantineClear: true,
	VerbRevoke:          true,
	VerbRegistryPublish: true, VerbRegistryPin: true,
	VerbReplayFlush: true,
	VerbApprove:     true, VerbReject: true,
}

// Verbs lists every control verb.
var Verbs = []string{
	VerbKillSwitchSet, VerbKillSwitchClear, VerbKillSwitchList,
	VerbQuarantineSet, VerbQuarantineClear, VerbQuarantineList,
	VerbRevoke, VerbRegistryPublish, VerbRegistryPin, VerbRegistryShow,
	VerbReplayStats, VerbReplayCheck, VerbReplayFlush, VerbStatus,
	VerbApprove, VerbReject,
}

// CtlSubject is the request/reply subject of a verb.
func CtlSubject(verb string) string { return SubjectCtl + verb }

// ControlSubject is the TALOS_CONTROL subject of an accepted mutating verb.
func ControlSubject(verb string) string { return SubjectControl + verb }

// StatusSubject is the heartbeat subject of a worker.
func StatusSubject(workerID string) string { return SubjectStatus + workerID }

// SubjectStatusAll matches every worker heartbeat.
const SubjectStatusAll = "talos.status.>"

// SubjectCtlAll matches every control request.
const SubjectCtlAll = "talos.ctl.>"

// EPInboxPrefix is the inbox prefix an enforcement point's NATS connection
// uses (nats.CustomInboxPrefix), so that NATS permissions can let it read
// its own replies (JetStream publish acks) and nobody else's.
func EPInboxPrefix(epID string) string { return "_INBOX.ep." + epID }

// NATS roles of talosd's users file (talosd --nats-auth), which talosctl
// reads to log in as the user for what it does. What each may publish and
// subscribe to is in cmd/talosd/natsauth.go.
const (
	// NATSRoleWorker is talosd itself (and other talosd joining the
	// embedded server): every subject.
	NATSRoleWorker = "worker"
	// NATSRoleResponder sends control requests (talos.ctl.>) and reads
	// worker heartbeats (talos.status.>) and the replies to its requests.
	NATSRoleResponder = "responder"
	// NATSRoleEnforcement is one enforcement point: it publishes calls on
	// its own subjects (EPCallSubjects) and reads its own decisions,
	// JetStream publish acks, and the approve and reject control events.
	NATSRoleEnforcement = "enforcement"
)

// ResponderInboxPrefix is the inbox prefix of a responder's connection
// (talosctl control commands): responders may read replies there, and not
// the workers' default inboxes, which carry raw calls.
const ResponderInboxPrefix = "_INBOX.responder"

// ControlCommandVersion is ControlCommand.schema_version.
const ControlCommandVersion = "talos.control_command.v1"

// Kill switch scopes: "global", or "<kind>:<value>".
const (
	ScopeGlobal  = "global"
	ScopeServer  = "server"  // server:<server_id>
	ScopeTool    = "tool"    // tool:<server_id>/<tool_name>
	ScopeAgent   = "agent"   // agent:<agent_id>
	ScopeSession = "session" // session:<session_id>
	// ScopeEgress is the exfiltration guard (CM-EGRESS): egress:global,
	// egress:agent:<agent_id> or egress:session:<session_id> blocks only
	// the registry's network_outbound tools (NETWORK_OUTBOUND_BLOCKED) for
	// the calls it covers, and leaves every other tool alone.
	ScopeEgress = "egress"
)

// ControlCommand is what a responder sends on talos.ctl.<verb>, signed with
// a responder key talosd trusts. Signature covers
// sha256(JCS(command without "signature")), like receipts. CommandID makes
// a retried command idempotent (it is the TALOS_CONTROL Nats-Msg-Id);
// IssuedAt must be within the control service's freshness window, so a
// captured command cannot be replayed later.
//
// Which fields a verb uses:
//
//	killswitch.set|clear   Scope (global | server:<id> | tool:<server_id>/<tool_name> | agent:<id> | session:<id>
//	                       | egress:global | egress:agent:<id> | egress:session:<id>), Reason
//	quarantine.set|clear   SessionID, Reason
//	revoke                 Target (a capability id, or agent:<agent_id>), Reason
//	registry.publish       Manifests (one manifest per server), Reason optional
//	registry.pin           Digest (sha256:<hex> of a published bundle), Reason optional
//	replay.check           SessionID, CorrelationID
//	replay.flush           SessionID (empty: every session), Reason
//	approve                Target (the tool_call_id of a call awaiting approval, or <ep_id>:<tool_call_id>), Reason optional
//	reject                 Target (likewise), Reason
//	*.list, registry.show, replay.stats, status: nothing
type ControlCommand struct {
	SchemaVersion string            `json:"schema_version" validate:"required,eq=talos.control_command.v1"`
	CommandID     string            `json:"command_id" validate:"required,uuid"`
	Verb          string            `json:"verb" validate:"required,max=64"`
	Actor         string            `json:"actor" validate:"required,max=256"`
	Reason        string            `json:"reason,omitempty" validate:"max=1024"`
	IssuedAt      string            `json:"issued_at" validate:"required"`
	Scope         string            `json:"scope,omitempty" validate:"max=600"`
	SessionID     string            `json:"session_id,omitempty" validate:"max=256"`
	Target        string            `json:"target,omitempty" validate:"max=300"`
	Digest        string            `json:"digest,omitempty" validate:"omitempty,startswith=sha256:,len=71"`
	CorrelationID string            `json:"correlation_id,omitempty" validate:"max=256"`
	Manifests     []json.RawMessage `json:"manifests,omitempty" validate:"max=1024"`
	Signature     *Signature        `json:"signature,omitempty"`
}

// ParseScope splits a kill-switch scope into its kind and value
// ("global" has no value; an egress scope's value is "global",
// "agent:<id>" or "session:<id>"). ok is false for an unknown kind or a
// value that cannot name anything (empty, a bad server_id, a tool scope
// without "/").
func ParseScope(s string) (kind, value string, ok bool) {
	if s == ScopeGlobal {
		return ScopeGlobal, "", true
	}
	kind, value, found := strings.Cut(s, ":")
	if !found || value == "" || len(value) > 512 {
		return "", "", false
	}
	switch kind {
	case ScopeServer:
		return kind, value, ValidID(value)
	case ScopeTool:
		server, tool, found := strings.Cut(value, "/")
		return kind, value, found && ValidID(server) && tool != "" && len(tool) <= 256
	case ScopeAgent, ScopeSession:
		return kind, value, len(value) <= 256
	case ScopeEgress:
		if value == ScopeGlobal {
			return kind, value, true
		}
		sub, id, found := strings.Cut(value, ":")
		return kind, value, found && (sub == ScopeAgent || sub == ScopeSession) && id != "" && len(id) <= 256
	}
	return "", "", false
}

// ControlRecord is data.control of a control receipt
// (dev.talos.receipt.control.v1): who asked for what, why, and what came
// of it. The same signed CloudEvent is appended to TALOS_CONTROL (accepted
// mutating commands only; workers replay those) and to TALOS_AUDIT (every
// command, accepted or refused).
type ControlRecord struct {
	CommandID string `json:"command_id"` // "" when the command could not be parsed
	Verb      string `json:"verb"`
	Actor     string `json:"actor"`
	Reason    string `json:"reason"`
	// Target names what the command acts on (scope, session, revoked id,
	// digest; for an accepted approve or reject, <ep_id>:<tool_call_id> of
	// the call it resolves, which the control service found in the call
	// ledger); "" for reads of everything.
	Target   string `json:"target"`
	Accepted bool   `json:"accepted"`
	// Code is "" when accepted, else one of the Ctl* refusal codes.
	Code string `json:"code"`
	// Seq is this event's TALOS_CONTROL stream sequence (accepted mutating
	// commands; 0 otherwise). Workers reject an event whose signed Seq is
	// not the sequence it was stored at, so an old event cannot be replayed
	// into the stream.
	Seq uint64 `json:"seq"`
	// CommandHash is hex sha256 of the command bytes exactly as received.
	CommandHash string `json:"command_hash"`
	// ResponderKID is the kid of the key that signed the command ("" if
	// unsigned).
	ResponderKID string `json:"responder_kid"`
	// Command is the verified command, responder signature included, so an
	// auditor can check the responder's signature too (accepted only).
	Command *ControlCommand `json:"command,omitempty"`
	// SuppressedBefore is, on a refusal, how many refusals of the same
	// identity (the responder key whose signature verified, else every
	// unverified command together) the control service's rate limit left
	// without a receipt since that identity's previous refusal receipt;
	// absent when none was.
	SuppressedBefore uint64 `json:"suppressed_before,omitempty"`
}

// Control refusal codes (ControlRecord.Code, ControlReply.Code).
const (
	CtlMalformed        = "CTL_MALFORMED"         // not JSON, or not a command
	CtlInvalid          = "CTL_INVALID"           // fails validation for its verb
	CtlUnsigned         = "CTL_UNSIGNED"          // no signature
	CtlUntrustedKey     = "CTL_UNTRUSTED_KEY"     // signed by a key talosd does not trust
	CtlSignatureInvalid = "CTL_SIGNATURE_INVALID" // signature does not match
	CtlStale            = "CTL_STALE"             // issued_at outside the freshness window
	CtlVerbMismatch     = "CTL_VERB_MISMATCH"     // verb differs from the subject
	CtlUnknownVerb      = "CTL_UNKNOWN_VERB"
	CtlNotFound         = "CTL_NOT_FOUND" // e.g. pin of a digest never published
	CtlConflict         = "CTL_CONFLICT"  // e.g. approve of a call already approved or rejected
	CtlInternal         = "CTL_INTERNAL"  // the service could not complete (retry)
)

// ControlReply answers a control request.
type ControlReply struct {
	OK        bool   `json:"ok"`
	Error     string `json:"error,omitempty"`
	Code      string `json:"code,omitempty"`
	Seq       uint64 `json:"seq,omitempty"`        // TALOS_CONTROL seq of an accepted mutation
	ReceiptID string `json:"receipt_id,omitempty"` // the control receipt
	// ReceiptSuppressed says that the refusal got no receipt: its
	// identity's refusal receipts were over the control service's rate
	// limit. The next receipt written for it counts this one
	// (ControlRecord.SuppressedBefore).
	ReceiptSuppressed bool `json:"receipt_suppressed,omitempty"`
	// Workers are the live workers the control service knew when it
	// answered; `--wait` waits for each to report Seq applied.
	Workers []string `json:"workers,omitempty"`
	// Read results.
	State  *IncidentView  `json:"state,omitempty"`
	Replay *ReplayInfo    `json:"replay,omitempty"`
	Status []WorkerStatus `json:"status,omitempty"`
}

// IncidentView is the enforcement state as of Seq (list/show replies).
type IncidentView struct {
	Seq          uint64       `json:"seq"`
	KillSwitches []StateEntry `json:"kill_switches"`
	Quarantines  []StateEntry `json:"quarantines"`
	Revocations  []StateEntry `json:"revocations"`
	Registry     RegistryView `json:"registry"`
}

// StateEntry is one active kill switch, quarantine or revocation, or one
// approval or rejection of a parked call.
type StateEntry struct {
	Target string `json:"target"` // scope, session id, revoked id, or <ep_id>:<tool_call_id>
	Reason string `json:"reason"`
	Actor  string `json:"actor"`
	Seq    uint64 `json:"seq"`  // control seq that set it
	Time   string `json:"time"` // when it was set
}

// RegistryView is the pinned registry and every published bundle.
type RegistryView struct {
	Pinned    string            `json:"pinned"` // digest; "" = the bootstrap registry
	PinnedSeq uint64            `json:"pinned_seq"`
	Published []PublishedBundle `json:"published"`
}

// PublishedBundle is one registry bundle stored by registry.publish.
type PublishedBundle struct {
	Digest  string   `json:"digest"`
	Servers []string `json:"servers"`
	Tools   int      `json:"tools"`
	Seq     uint64   `json:"seq"`
	Time    string   `json:"time"`
	Actor   string   `json:"actor"`
}

// ReplayInfo answers replay.stats and replay.check.
type ReplayInfo struct {
	Keys     uint64 `json:"keys"`                // correlation ids remembered (shared store)
	Bytes    uint64 `json:"bytes"`               // shared store size
	Window   string `json:"window"`              // how long an id is remembered
	Seen     *bool  `json:"seen,omitempty"`      // replay.check
	ToolCall string `json:"tool_call,omitempty"` // replay.check: the call that used it, <ep_id>:<tool_call_id>
}

// WorkerStatus is a heartbeat on talos.status.<worker_id>: what the worker
// enforces. A worker publishes one every interval and at once after it
// applies a control event.
type WorkerStatus struct {
	WorkerID       string `json:"worker_id"`
	Instance       string `json:"instance"`
	AppliedSeq     uint64 `json:"applied_seq"`  // last TALOS_CONTROL seq applied
	ControlLast    uint64 `json:"control_last"` // last TALOS_CONTROL seq it knows of
	CaughtUp       bool   `json:"caught_up"`    // replayed to the tail: deciding
	RegistryDigest string `json:"registry_digest"`
	Rejected       uint64 `json:"rejected"` // control events it refused to apply (bad signature/seq)
	Handled        uint64 `json:"handled"`  // calls decided
	Time           string `json:"time"`
	IntervalMS     int64  `json:"interval_ms"` // heartbeat interval: absent for 3× this means gone
	// Stopping is set on the last heartbeat of a worker shutting down
	// cleanly: it is no longer live from that moment.
	Stopping bool `json:"stopping,omitempty"`
}
