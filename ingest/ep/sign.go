package ep

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// CallSigner makes calls an agent can prove (CP-SFC): it attaches one
// capability chain to each envelope with its request_hash and, given the
// holder's key, signs the envelope's signed fields (sender_signature). The
// chain is canonicalised and hashed once. It is safe for concurrent use.
type CallSigner struct {
	chain  json.RawMessage // RFC 8785 form, as sent
	hash   string          // hex sha256 of chain: the envelope's capability_hash
	holder string
	parsed schemas.CapabilityChain
	key    *receipts.PrivateKey
}

// NewCallSigner reads a capability chain (JSON, as `talosctl cap issue`
// writes it). key may be nil: the chain and request_hash are attached but
// the envelope is not signed (for testing what the worker does then).
func NewCallSigner(chainJSON []byte, key *receipts.PrivateKey) (*CallSigner, error) {
	canon, err := jsonkit.Canonicalize(chainJSON)
	if err != nil {
		return nil, fmt.Errorf("capability chain: not JSON: %w", err)
	}
	var chain schemas.CapabilityChain
	if err := json.Unmarshal(canon, &chain); err != nil {
		return nil, fmt.Errorf("capability chain: %w", err)
	}
	sum := sha256.Sum256(canon)
	return &CallSigner{chain: canon, hash: hex.EncodeToString(sum[:]), holder: chain.Holder(), parsed: chain, key: key}, nil
}

// LoadCallSigner reads a capability chain file and, if keyFile is not "",
// the holder's key (.key). Errors name which of the two failed
// ("capability: …", "agent key: …", "capability chain: …").
func LoadCallSigner(capFile, keyFile string) (*CallSigner, error) {
	raw, err := os.ReadFile(capFile)
	if err != nil {
		return nil, fmt.Errorf("capability: %w", err)
	}
	var key *receipts.PrivateKey
	if keyFile != "" {
		if key, err = receipts.LoadPrivateKey(keyFile); err != nil {
			return nil, fmt.Errorf("agent key: %w", err)
		}
	}
	return NewCallSigner(raw, key)
}

// Holder is the agent the chain was last handed to.
func (s *CallSigner) Holder() string { return s.holder }

// Chain is the capability chain the signer attaches, as parsed. It is
// shared: do not modify it.
func (s *CallSigner) Chain() *schemas.CapabilityChain { return &s.parsed }

// Sign attaches the chain and request_hash to c and, with a key, signs
// it. Sign again after any change to the request, session, correlation id
// or issued_at (a post event has its own issued_at).
func (s *CallSigner) Sign(c *schemas.ToolCall) error {
	if err := HashRequest(c); err != nil {
		return fmt.Errorf("request_hash: %w", err)
	}
	c.Capability = s.chain
	if s.key == nil {
		c.SenderSignature = nil
		return nil
	}
	sig, err := enforce.SignEnvelope(s.key, schemas.EnvelopeSignedFields{
		CorrelationID:  c.CorrelationID,
		CapabilityHash: s.hash,
		RequestHash:    c.RequestHash,
		Tool:           c.ServerID + ":" + c.ToolName,
		Method:         c.Method(),
		Timestamp:      c.IssuedAt,
		SessionID:      c.SessionID,
	})
	if err != nil {
		return err
	}
	c.SenderSignature, err = json.Marshal(sig)
	return err
}

// HashRequest sets c's request_hash: the hex sha256 of the RFC 8785 form
// of its request. It fails on arguments that cannot be canonicalised.
func HashRequest(c *schemas.ToolCall) error {
	h, err := requestHash(&c.Request)
	if err != nil {
		return err
	}
	c.RequestHash = h
	return nil
}

// requestHash is the hex sha256 of the RFC 8785 form of req.
func requestHash(req *schemas.Request) (string, error) {
	b, err := jsonkit.MarshalCanonical(req)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
