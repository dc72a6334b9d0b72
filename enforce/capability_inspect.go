package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// ChainLink is one link of a capability chain as a person reads it:
// who issued or delegated it, to whom, what it allows and until when.
type ChainLink struct {
	Index        int      `json:"index"`
	Kind         string   `json:"kind"` // capability | delegation
	CapabilityID string   `json:"capability_id"`
	Issuer       string   `json:"issuer,omitempty"`
	Delegator    string   `json:"delegator,omitempty"`
	Holder       string   `json:"holder"`
	HolderKID    string   `json:"holder_kid,omitempty"`
	SignerKID    string   `json:"signer_kid,omitempty"`
	Scopes       []string `json:"scopes"`
	ReadOnly     bool     `json:"read_only"`
	IssuedAt     string   `json:"issued_at"`
	ExpiresAt    string   `json:"expires_at"`
	Expiry       string   `json:"expiry"` // "expires in 59m0s" / "expired 3m0s ago"
}

// ScopeQuery is a call to check a chain's effective scopes against
// (Resource nil: the call has no resource).
type ScopeQuery struct {
	Server, Tool, Method string
	Resource             *string
}

// NewScopeQuery is the ScopeQuery of `talosctl cap inspect`'s call flags:
// nil without a server; server and tool go together, and method and
// resource need them. The errors name the flags.
func NewScopeQuery(server, tool, method string, resource *string) (*ScopeQuery, error) {
	if (server == "") != (tool == "") {
		return nil, errors.New("--server and --tool go together")
	}
	if server == "" {
		if method != "" || resource != nil {
			return nil, errors.New("--method and --resource need --server and --tool")
		}
		return nil, nil
	}
	return &ScopeQuery{Server: server, Tool: tool, Method: method, Resource: resource}, nil
}

// Inspection is what InspectChain finds of a chain file: the verdict of
// VerifyChain (plus SCOPE_MISMATCH when a ScopeQuery is not covered), the
// chain's hash and its links.
type Inspection struct {
	Result AuthResult
	// Hash is hex sha256(JCS(chain)), "" if the bytes do not canonicalize.
	Hash string
	// Links are nil if the chain does not decode.
	Links []ChainLink
}

// Valid reports whether the inspection found nothing wrong.
func (in *Inspection) Valid() bool { return len(in.Result.Codes) == 0 }

// InspectChain verifies the chain in raw at now, as a worker would
// (VerifyChain), describes its links, and with q also checks that the last
// link's scopes cover that call.
func (a *Authorizer) InspectChain(raw []byte, now time.Time, revoked func(string) bool, q *ScopeQuery) Inspection {
	in := Inspection{Result: a.VerifyChain(json.RawMessage(raw), now, revoked)}
	if canon, err := jsonkit.Canonicalize(raw); err == nil {
		sum := sha256.Sum256(canon)
		in.Hash = hex.EncodeToString(sum[:])
	}
	var chain schemas.CapabilityChain
	if json.Unmarshal(raw, &chain) != nil {
		return in
	}
	in.Links = DescribeChain(&chain, now)
	if q == nil || len(in.Links) == 0 {
		return in
	}
	resource := ""
	if q.Resource != nil {
		resource = *q.Resource
	}
	if !ScopesCover(chain.Scopes(), q.Server, q.Tool, q.Method, resource, q.Resource != nil) {
		r := &in.Result
		if !slices.Contains(r.Codes, schemas.CodeScopeMismatch) { // after the chain codes
			r.Codes = append(r.Codes, schemas.CodeScopeMismatch)
		}
		r.Details = append(r.Details, fmt.Sprintf("capability: no scope of link %d covers this call", len(in.Links)-1))
	}
	return in
}

// DescribeChain describes each link of a decoded chain, expiry relative to
// now. It verifies nothing.
func DescribeChain(c *schemas.CapabilityChain, now time.Time) []ChainLink {
	kidOf := func(s string) string {
		if pub, err := ParsePublicKeyString(s); err == nil {
			return verify.KeyID(pub)
		}
		return "(malformed key)"
	}
	signer := func(s *schemas.Signature) string {
		if s == nil {
			return "(unsigned)"
		}
		return s.KID
	}
	root := c.Capability
	links := []ChainLink{{
		Index: 0, Kind: "capability", CapabilityID: root.CapabilityID, Issuer: root.Issuer, Holder: root.Subject,
		HolderKID: kidOf(root.SubjectPublicKey), SignerKID: signer(root.Signature), Scopes: root.Scopes,
		ReadOnly: root.Constraints.IsReadOnly(), IssuedAt: root.IssuedAt, ExpiresAt: root.ExpiresAt,
		Expiry: expiryText(root.ExpiresAt, now),
	}}
	for i, d := range c.Delegations {
		links = append(links, ChainLink{
			Index: i + 1, Kind: "delegation", CapabilityID: d.CapabilityID, Delegator: d.DelegatorID, Holder: d.DelegateeID,
			HolderKID: kidOf(d.DelegateePublicKey), SignerKID: signer(d.Signature), Scopes: d.ChildScope,
			ReadOnly: d.Constraints.IsReadOnly(), IssuedAt: d.IssuedAt, ExpiresAt: d.ExpiresAt,
			Expiry: expiryText(d.ExpiresAt, now),
		})
	}
	return links
}

// expiryText says "expires in 59m0s" or "expired 3m0s ago".
func expiryText(expiresAt string, now time.Time) string {
	t, err := time.Parse(time.RFC3339Nano, expiresAt)
	if err != nil {
		return "expiry unreadable"
	}
	d := t.Sub(now).Round(time.Second)
	if d >= 0 {
		return "expires in " + d.String()
	}
	return "expired " + (-d).String() + " ago"
}
