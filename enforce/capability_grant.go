package enforce

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// Lifetime is when a capability or delegation expires, as `talosctl cap
// issue` and `cap delegate` take it (--ttl, --expires): TTL after the
// issue time, or Expires, an RFC 3339 time; the zero Lifetime means the
// caller's default. ExpiresAt's errors name those flags.
type Lifetime struct {
	TTL     time.Duration
	Expires string
}

// ExpiresAt is expires_at for a link issued at now; def when neither TTL
// nor Expires is set. Both set, a negative TTL or an Expires that is not
// RFC 3339 are errors.
func (l Lifetime) ExpiresAt(now, def time.Time) (time.Time, error) {
	switch {
	case l.TTL != 0 && l.Expires != "":
		return time.Time{}, errors.New("give --ttl or --expires, not both")
	case l.TTL < 0:
		return time.Time{}, errors.New("--ttl must be positive")
	case l.TTL > 0:
		return now.Add(l.TTL), nil
	case l.Expires != "":
		t, err := time.Parse(time.RFC3339Nano, l.Expires)
		if err != nil {
			return time.Time{}, errors.New("--expires: not an RFC 3339 time")
		}
		return t, nil
	}
	return def, nil
}

// Grant is one link to sign: a capability issued to an agent, or a
// delegation from a chain's holder to another agent (CP- capability
// protocol in docs/REQUIREMENTS.md).
type Grant struct {
	// ID is the link's capability_id; "" gives a new UUIDv7.
	ID string
	// To is the agent the link is for (subject or delegatee), ToKey its
	// public key: it signs that agent's envelopes and delegations.
	To    string
	ToKey ed25519.PublicKey
	// Scopes are the link's scopes (for a delegation, each within the
	// holder's).
	Scopes []string
	// ReadOnly adds the read_only constraint.
	ReadOnly bool
	// IssuedAt and ExpiresAt are the link's times, written in the wire
	// form (RFC 3339, milliseconds, UTC).
	IssuedAt, ExpiresAt time.Time
}

func (g *Grant) id() string {
	if g.ID != "" {
		return g.ID
	}
	return uuid.Must(uuid.NewV7()).String()
}

func (g *Grant) constraints() *schemas.Constraints {
	if g.ReadOnly {
		return &schemas.Constraints{ReadOnly: true}
	}
	return nil
}

// wireTime formats t as capabilities carry times.
func wireTime(t time.Time) string { return t.UTC().Format(schemas.TimeFormat) }

// IssueChain signs g as a root capability with the issuer's key and
// returns it as a chain without delegations. issuerName is the issuer
// recorded in the capability ("" names it issuer-<kid>). The errors are
// IssueCapability's.
func IssueChain(issuer *receipts.PrivateKey, issuerName string, g Grant) (*schemas.CapabilityChain, error) {
	if issuerName == "" {
		issuerName = "issuer-" + issuer.KID
	}
	c := schemas.Capability{
		CapabilityID: g.id(), Issuer: issuerName, Subject: g.To, SubjectPublicKey: PublicKeyString(g.ToKey),
		Scopes: g.Scopes, IssuedAt: wireTime(g.IssuedAt), ExpiresAt: wireTime(g.ExpiresAt), Constraints: g.constraints(),
	}
	signed, err := IssueCapability(issuer, c)
	if err != nil {
		return nil, err
	}
	return &schemas.CapabilityChain{Capability: signed}, nil
}

// DelegateGrant appends g to chain as a delegation signed by the chain's
// holder (ExtendChain: the read_only constraint of the parent is kept).
func DelegateGrant(holder *receipts.PrivateKey, chain *schemas.CapabilityChain, g Grant) error {
	return ExtendChain(holder, chain, schemas.Delegation{
		CapabilityID: g.id(), ChildScope: g.Scopes, IssuedAt: wireTime(g.IssuedAt), ExpiresAt: wireTime(g.ExpiresAt),
		DelegateeID: g.To, DelegateePublicKey: PublicKeyString(g.ToKey), Constraints: g.constraints(),
	})
}

// ChainExpiresAt is the chain's expiry: its last link's expires_at.
func ChainExpiresAt(chain *schemas.CapabilityChain) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, chain.ExpiresAt())
	if err != nil {
		return time.Time{}, fmt.Errorf("enforce: the last link's expires_at is not an RFC 3339 time")
	}
	return t, nil
}

// ChainFile describes a chain written to a file, as `talosctl cap issue`
// and `cap delegate` report it (the JSON keys in alphabetical order).
type ChainFile struct {
	CapabilityIDs []string `json:"capability_ids"` // root first
	ChainHash     string   `json:"chain_hash"`
	File          string   `json:"file"`
	Holder        string   `json:"holder"`
}

// DescribeChainFile describes chain, written to file.
func DescribeChainFile(file string, chain *schemas.CapabilityChain) (*ChainFile, error) {
	h, err := ChainHash(chain)
	if err != nil {
		return nil, err
	}
	return &ChainFile{CapabilityIDs: chain.CapabilityIDs(), ChainHash: h, File: file, Holder: chain.Holder()}, nil
}

// WriteText writes "<what> <file>", then the last capability id, the
// holder and the chain hash, one a line.
func (f *ChainFile) WriteText(w io.Writer, what string) error {
	_, err := fmt.Fprintf(w, "%s %s\n  capability id %s\n  holder        %s\n  chain hash    %s\n",
		what, f.File, f.CapabilityIDs[len(f.CapabilityIDs)-1], f.Holder, f.ChainHash)
	return err
}
