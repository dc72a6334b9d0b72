package ingest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// SignCall makes c a call its agent can prove (seed 002): it attaches the
// capability chain, sets request_hash = sha256(JCS(request)) and actor.agent_id
// to the chain's holder, and signs the envelope's signed fields with the
// holder's key (sender_signature). Sign after the last change to the
// request, session, correlation id or issued_at.
func SignCall(c *schemas.ToolCall, chain *schemas.CapabilityChain, holder *receipts.PrivateKey) error {
	if c == nil || chain == nil || holder == nil {
		return errors.New("ingest: SignCall needs a call, a chain and the holder's key")
	}
	req, err := receipts.MarshalCanonical(c.Request)
	if err != nil {
		return fmt.Errorf("ingest: sign call: request: %w", err)
	}
	sum := sha256.Sum256(req)
	c.RequestHash = hex.EncodeToString(sum[:])
	capJSON, err := json.Marshal(chain)
	if err != nil {
		return fmt.Errorf("ingest: sign call: capability: %w", err)
	}
	chainHash, err := enforce.ChainHash(chain)
	if err != nil {
		return fmt.Errorf("ingest: sign call: capability: %w", err)
	}
	c.Capability = capJSON
	c.Actor.AgentID = ChainHolder(chain)
	sig, err := enforce.SignEnvelope(holder, schemas.EnvelopeSignedFields{
		CorrelationID:  c.CorrelationID,
		CapabilityHash: chainHash,
		RequestHash:    c.RequestHash,
		Tool:           c.ServerID + ":" + c.ToolName,
		Method:         schemas.MethodToolsCall,
		Timestamp:      c.IssuedAt,
		SessionID:      c.SessionID,
	})
	if err != nil {
		return fmt.Errorf("ingest: sign call: %w", err)
	}
	if c.SenderSignature, err = json.Marshal(sig); err != nil {
		return err
	}
	return nil
}

// ChainHolder is the agent a capability chain was last handed to.
func ChainHolder(chain *schemas.CapabilityChain) string {
	if n := len(chain.Delegations); n > 0 {
		return chain.Delegations[n-1].DelegateeID
	}
	return chain.Capability.Subject
}
