package ep

import (
	"encoding/json"

	"github.com/talos-audit/talos/schemas"
)

// DefaultAgent is actor.agent_id of a CallSpec that names no agent and
// has no capability chain to take its holder from.
const DefaultAgent = "talosctl-agent"

// CallSpec is one tool call as an operator describes it to an
// enforcement point (`talosctl call`): what to call, as whom, and the
// envelope fields a test may need to set. Zero fields take NewCall's
// values.
type CallSpec struct {
	EPID, Server, Tool string
	Args               json.RawMessage
	// Agent is actor.agent_id; "" is the signer's chain holder, else
	// DefaultAgent.
	Agent          string
	Session        string // session_id; "" a new one
	IdempotencyKey string
	ToolClass      string // the declared tool_class (a mismatch is denied)
	RegistryDigest string
	ExpectedHashes []schemas.ExpectedHash
}

// Envelope is the phase-pre envelope of s with fresh ids, signed by signer
// (its capability chain attached, CP-SFC) when signer is not nil.
func (s *CallSpec) Envelope(signer *CallSigner) (*schemas.ToolCall, error) {
	call, err := NewCall(s.EPID, s.Server, s.Tool, s.Args)
	if err != nil {
		return nil, err
	}
	call.Actor.AgentID = s.Agent
	if call.Actor.AgentID == "" && signer != nil {
		call.Actor.AgentID = signer.Holder()
	}
	if call.Actor.AgentID == "" {
		call.Actor.AgentID = DefaultAgent
	}
	if s.Session != "" {
		call.SessionID = s.Session
	}
	call.IdempotencyKey, call.ToolClass, call.RegistryDigest = s.IdempotencyKey, s.ToolClass, s.RegistryDigest
	call.ExpectedDocumentHashes = append(call.ExpectedDocumentHashes, s.ExpectedHashes...)
	if signer != nil {
		if err := signer.Sign(call); err != nil {
			return nil, err
		}
	}
	return call, nil
}

// EnvelopeRoute reads what Send routes a raw envelope by: its phase
// (phase pre when absent), server_id and tool_call_id, each "" when the
// bytes do not say. It never fails: the worker judges the envelope.
func EnvelopeRoute(raw []byte) (phase, serverID, toolCallID string) {
	var ids struct {
		Phase      string `json:"phase"`
		ServerID   string `json:"server_id"`
		ToolCallID string `json:"tool_call_id"`
	}
	_ = json.Unmarshal(raw, &ids)
	if ids.Phase == "" {
		ids.Phase = schemas.PhasePre
	}
	return ids.Phase, ids.ServerID, ids.ToolCallID
}
