package enforce

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Signing of capabilities, delegations and envelope sender signatures.
//
// Each signed object names its type in a "type" member and its signature
// covers sha256(JCS(object without "signature")), so a signature made for
// one object type cannot verify as another. The verifier (Authorizer)
// recomputes the same bytes from the JSON it received.

// b64 is base64url without padding; Strict rejects non-zero trailing
// bits, so one signature or key has exactly one text form.
var b64 = base64.RawURLEncoding.Strict()

// PublicKeyString is the wire form of an Ed25519 public key
// (subject_public_key, delegatee_public_key): base64url without padding.
func PublicKeyString(pub ed25519.PublicKey) string {
	return base64.RawURLEncoding.EncodeToString(pub)
}

// ParsePublicKeyString parses PublicKeyString's form.
func ParsePublicKeyString(s string) (ed25519.PublicKey, error) {
	raw, err := b64.DecodeString(s)
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, errors.New("enforce: public key is not a base64url Ed25519 public key")
	}
	return ed25519.PublicKey(raw), nil
}

// signDigest signs a 32-byte digest with key.
func signDigest(key *receipts.PrivateKey, sum [32]byte) (*schemas.Signature, error) {
	if key == nil || len(key.Key) != ed25519.PrivateKeySize {
		return nil, errors.New("enforce: no valid signing key")
	}
	return &schemas.Signature{
		Alg: schemas.SignatureAlg,
		KID: verify.KeyID(key.Public()),
		Sig: base64.RawURLEncoding.EncodeToString(receipts.Sign(key.Key, sum[:])),
	}, nil
}

// canonicalSum is sha256(JCS(v)).
func canonicalSum(v any) ([32]byte, error) {
	b, err := jsonkit.MarshalCanonical(v)
	if err != nil {
		return [32]byte{}, fmt.Errorf("enforce: canonical: %w", err)
	}
	return sha256.Sum256(b), nil
}

// parseTime parses an RFC 3339 time as capability.schema.json's
// date-time format admits.
func parseTime(s string) (time.Time, error) {
	return time.Parse(time.RFC3339Nano, s)
}

// checkTimes checks that issued and expires are RFC 3339 and expires is
// after issued.
func checkTimes(issued, expires string) (time.Time, time.Time, error) {
	i, err := parseTime(issued)
	if err != nil {
		return i, i, errors.New("issued_at is not an RFC 3339 time")
	}
	e, err := parseTime(expires)
	if err != nil {
		return i, e, errors.New("expires_at is not an RFC 3339 time")
	}
	if !e.After(i) {
		return i, e, errors.New("expires_at is not after issued_at")
	}
	return i, e, nil
}

func checkScopes(what string, scopes []string) error {
	if len(scopes) == 0 {
		return fmt.Errorf("%s: at least one scope is required", what)
	}
	if len(scopes) > MaxScopes {
		return fmt.Errorf("%s: more than %d scopes", what, MaxScopes)
	}
	seen := map[string]bool{}
	for i, s := range scopes {
		if _, err := ParseScope(s); err != nil {
			return fmt.Errorf("%s[%d]: %w", what, i, err)
		}
		if seen[s] {
			return fmt.Errorf("%s[%d]: duplicate scope", what, i)
		}
		seen[s] = true
	}
	return nil
}

// IssueCapability signs c with the issuer's key and returns it with Type
// and Signature set. It checks what the issuer controls: scopes parse,
// times are RFC 3339 with expires_at after issued_at, the subject public
// key parses, and the result matches capability.schema.json.
func IssueCapability(issuer *receipts.PrivateKey, c schemas.Capability) (schemas.Capability, error) {
	c.Type = schemas.CapabilityTypeV1
	c.Signature = nil
	if err := checkScopes("scopes", c.Scopes); err != nil {
		return c, fmt.Errorf("enforce: issue capability: %w", err)
	}
	if _, _, err := checkTimes(c.IssuedAt, c.ExpiresAt); err != nil {
		return c, fmt.Errorf("enforce: issue capability: %w", err)
	}
	if _, err := ParsePublicKeyString(c.SubjectPublicKey); err != nil {
		return c, fmt.Errorf("enforce: issue capability: subject_public_key: %w", err)
	}
	sum, err := canonicalSum(&c)
	if err != nil {
		return c, err
	}
	if c.Signature, err = signDigest(issuer, sum); err != nil {
		return c, fmt.Errorf("enforce: issue capability: %w", err)
	}
	if err := validateChain(&schemas.CapabilityChain{Capability: c}); err != nil {
		return c, fmt.Errorf("enforce: issue capability: %w", err)
	}
	return c, nil
}

// Delegate signs d with the key of parent's holder (the capability's
// subject, or the delegation's delegatee) and returns it with Type,
// ParentCapabilityHash, DelegatorID (when empty: the parent's holder) and
// Signature set. parent is a schemas.Capability or schemas.Delegation (or
// a pointer to one), signed. It refuses what the verifier would reject:
// a holder key that is not the parent's holder key, a delegator that is
// not the parent's holder, a child scope the parent's scopes do not
// contain, a dropped read_only, or a lifetime outside the parent's. The
// chain depth is the caller's to keep within MaxDelegationDepth.
func Delegate(holder *receipts.PrivateKey, parent any, d schemas.Delegation) (schemas.Delegation, error) {
	fail := func(format string, a ...any) (schemas.Delegation, error) {
		return d, fmt.Errorf("enforce: delegate: "+format, a...)
	}
	switch p := parent.(type) {
	case *schemas.Capability:
		if p == nil {
			return fail("no parent")
		}
		return Delegate(holder, *p, d)
	case *schemas.Delegation:
		if p == nil {
			return fail("no parent")
		}
		return Delegate(holder, *p, d)
	}
	pl, ok := parentOf(parent)
	if !ok {
		return fail("parent is a %T, want schemas.Capability or schemas.Delegation", parent)
	}
	if holder == nil || len(holder.Key) != ed25519.PrivateKeySize {
		return fail("no valid holder key")
	}
	if PublicKeyString(holder.Public()) != pl.holderKey {
		return fail("the holder key is not the parent's holder key")
	}
	parentHash, err := CapabilityObjectHash(parent)
	if err != nil {
		return fail("%v", err)
	}
	d.Type = schemas.DelegationTypeV1
	d.ParentCapabilityHash = parentHash
	d.Signature = nil
	if d.DelegatorID == "" {
		d.DelegatorID = pl.holderID
	}
	if err := pl.admits(&d); err != nil {
		return fail("%v", err)
	}
	sum, err := canonicalSum(&d)
	if err != nil {
		return d, err
	}
	if d.Signature, err = signDigest(holder, sum); err != nil {
		return fail("%v", err)
	}
	return d, nil
}

// delegationParent is what a delegation inherits from the link it extends.
type delegationParent struct {
	holderID, holderKey string
	scopes              []string
	issued, expires     string
	readOnly            bool
}

// parentOf reads the link a delegation extends: a capability or a
// delegation (by value).
func parentOf(parent any) (delegationParent, bool) {
	switch p := parent.(type) {
	case schemas.Capability:
		return delegationParent{p.Subject, p.SubjectPublicKey, p.Scopes, p.IssuedAt, p.ExpiresAt, p.Constraints.IsReadOnly()}, true
	case schemas.Delegation:
		return delegationParent{p.DelegateeID, p.DelegateePublicKey, p.ChildScope, p.IssuedAt, p.ExpiresAt, p.Constraints.IsReadOnly()}, true
	}
	return delegationParent{}, false
}

// admits checks that d may extend the parent: its delegator is the
// parent's holder, its scopes lie within the parent's, it keeps read_only,
// its validity lies within the parent's, and its delegatee key reads.
func (pl delegationParent) admits(d *schemas.Delegation) error {
	if d.DelegatorID != pl.holderID {
		return errors.New("delegator_id is not the parent's holder")
	}
	if err := checkScopes("child_scope", d.ChildScope); err != nil {
		return err
	}
	for i, s := range d.ChildScope {
		if !scopeContained(pl.scopes, s) {
			return fmt.Errorf("child_scope[%d] is not contained in the parent's scopes", i)
		}
	}
	if pl.readOnly && (d.Constraints == nil || !d.Constraints.ReadOnly) {
		return errors.New("the parent is read_only; a delegation cannot drop it")
	}
	issued, expires, err := checkTimes(d.IssuedAt, d.ExpiresAt)
	if err != nil {
		return err
	}
	if pi, err := parseTime(pl.issued); err != nil || issued.Before(pi) {
		return errors.New("issued_at is before the parent's issued_at")
	}
	if pe, err := parseTime(pl.expires); err != nil || expires.After(pe) {
		return errors.New("expires_at is after the parent's expires_at")
	}
	if _, err := ParsePublicKeyString(d.DelegateePublicKey); err != nil {
		return fmt.Errorf("delegatee_public_key: %w", err)
	}
	return nil
}

// scopeContained reports whether some parent scope contains child.
func scopeContained(parents []string, child string) bool {
	c, err := ParseScope(child)
	if err != nil {
		return false
	}
	for _, p := range parents {
		if ps, err := ParseScope(p); err == nil && ps.Contains(c) {
			return true
		}
	}
	return false
}

// CapabilityObjectHash is hex sha256(JCS(v)) of a signed capability or
// delegation, signature included: a delegation's parent_capability_hash.
// v is a schemas.Capability or schemas.Delegation (or pointer), or the
// object's decoded JSON tree.
func CapabilityObjectHash(v any) (string, error) {
	var (
		b   []byte
		err error
	)
	switch v.(type) {
	case map[string]any:
		b, err = jsonkit.CanonicalTree(v)
	case schemas.Capability, *schemas.Capability, schemas.Delegation, *schemas.Delegation:
		b, err = jsonkit.MarshalCanonical(v)
	default:
		return "", fmt.Errorf("enforce: capability object hash: unsupported %T", v)
	}
	if err != nil {
		return "", fmt.Errorf("enforce: capability object hash: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// ChainHash is an envelope's capability_hash for chain: hex
// sha256(JCS(chain)), equal to what the worker computes from the
// envelope's "capability" member when the chain is sent as marshalled.
func ChainHash(c *schemas.CapabilityChain) (string, error) {
	if c == nil {
		return "", errors.New("enforce: chain hash: no chain")
	}
	b, err := jsonkit.MarshalCanonical(c)
	if err != nil {
		return "", fmt.Errorf("enforce: chain hash: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// SignEnvelope makes an envelope's sender_signature: the chain holder's
// signature over sha256(JCS(f)) with f.Type set to EnvelopeSignatureV1.
// f.Tool is "<server_id>:<tool_name>", f.Method schemas.MethodToolsCall,
// f.Timestamp the envelope's issued_at.
func SignEnvelope(holder *receipts.PrivateKey, f schemas.EnvelopeSignedFields) (schemas.Signature, error) {
	f.Type = schemas.EnvelopeSignatureV1
	s, err := signDigest(holder, envelopeDigest(&f))
	if err != nil {
		return schemas.Signature{}, fmt.Errorf("enforce: sign envelope: %w", err)
	}
	return *s, nil
}

// envelopeDigest is sha256(JCS(f)), the digest a sender signature signs,
// equal to canonicalSum(f) for every f. It writes the RFC 8785 form
// directly: the members in RFC 8785 order (all keys are ASCII, so
// byte order is UTF-16 order), each value a JCS string.
func envelopeDigest(f *schemas.EnvelopeSignedFields) [sha256.Size]byte {
	var buf [512]byte
	b := append(buf[:0], `{"capability_hash":`...)
	b = jsonkit.AppendString(b, f.CapabilityHash)
	b = append(b, `,"correlation_id":`...)
	b = jsonkit.AppendString(b, f.CorrelationID)
	b = append(b, `,"method":`...)
	b = jsonkit.AppendString(b, f.Method)
	b = append(b, `,"request_hash":`...)
	b = jsonkit.AppendString(b, f.RequestHash)
	b = append(b, `,"session_id":`...)
	b = jsonkit.AppendString(b, f.SessionID)
	b = append(b, `,"timestamp":`...)
	b = jsonkit.AppendString(b, f.Timestamp)
	b = append(b, `,"tool":`...)
	b = jsonkit.AppendString(b, f.Tool)
	b = append(b, `,"type":`...)
	b = jsonkit.AppendString(b, f.Type)
	b = append(b, '}')
	return sha256.Sum256(b)
}

// validateChain checks a chain against capability.schema.json.
func validateChain(c *schemas.CapabilityChain) error {
	b, err := jsonkit.MarshalCanonical(c)
	if err != nil {
		return err
	}
	return schemas.ValidateCapabilityChain(b)
}

// ExtendChain delegates from chain's holder: it signs d under the chain's
// last link (Delegate), adding the read_only constraint when the chain
// carries it (a delegation may not drop it), and appends it to chain. It
// refuses a chain that already has MaxDelegationDepth delegations; chain
// is unchanged on error.
func ExtendChain(holder *receipts.PrivateKey, chain *schemas.CapabilityChain, d schemas.Delegation) error {
	n := len(chain.Delegations)
	if n >= schemas.MaxDelegationDepth {
		return fmt.Errorf("enforce: delegate: the chain already has %d delegations (MAX_DELEGATION_DEPTH)", n)
	}
	var parent any = chain.Capability
	if n > 0 {
		parent = chain.Delegations[n-1]
	}
	if chain.ReadOnly() && !d.Constraints.IsReadOnly() {
		d.Constraints = &schemas.Constraints{ReadOnly: true}
	}
	signed, err := Delegate(holder, parent, d)
	if err != nil {
		return err
	}
	chain.Delegations = append(chain.Delegations, signed)
	return nil
}
