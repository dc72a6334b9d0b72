package enforce

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// CapabilityConfig configures an Authorizer. The zero value trusts no
// issuer and uses the defaults.
type CapabilityConfig struct {
	// Issuers are the trusted issuer keys (kid -> key); empty trusts no
	// issuer, so every capability is SIGNATURE_INVALID.
	Issuers receipts.KeySet
	// Skew widens every link's [issued_at, expires_at] on both sides.
	// 0 means DefaultCapabilitySkew (seed 002: 60 s).
	Skew time.Duration
	// VerifyCache is how many verified signatures of immutable signed
	// objects (keyed by the object's hash, signature included, and the
	// verifying key) and schema-valid chains (keyed by the hash of their
	// canonical bytes) are remembered; only successes are. Nothing about
	// expiry, revocation, scope or the sender signature is cached. 0 means
	// DefaultVerifyCache.
	VerifyCache int
}

// Capability defaults.
const (
	DefaultCapabilitySkew = schemas.CapabilitySkewSeconds * time.Second
	DefaultVerifyCache    = 4096
)

// Authorizer is seed 002's CapabilityManager.authorize: it checks an
// envelope's capability chain and sender signature per request. It holds
// only immutable configuration and a cache of verified signatures, so it
// is safe for concurrent use.
type Authorizer struct {
	issuers receipts.KeySet
	skew    time.Duration
	// verified holds objectHash+"\x00"+publicKey for every signature that
	// verified (an object hash covers the signature, so a hit means this
	// exact object was signed by this exact key), and "schema\x00"+sha256
	// of the canonical bytes of every chain that matched the schema.
	verified *lru.Cache[string, struct{}]
}

// NewAuthorizer checks cfg and returns an Authorizer. Every issuer kid must
// be the key's receipts.KeyID.
func NewAuthorizer(cfg CapabilityConfig) (*Authorizer, error) {
	if cfg.Skew < 0 {
		return nil, errors.New("enforce: capability skew is negative")
	}
	if cfg.Skew == 0 {
		cfg.Skew = DefaultCapabilitySkew
	}
	if cfg.VerifyCache < 0 {
		return nil, errors.New("enforce: capability verify cache size is negative")
	}
	if cfg.VerifyCache == 0 {
		cfg.VerifyCache = DefaultVerifyCache
	}
	issuers := make(receipts.KeySet, len(cfg.Issuers))
	for kid, pub := range cfg.Issuers {
		if len(pub) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("enforce: issuer key %s is not an Ed25519 public key", kid)
		}
		if receipts.KeyID(pub) != kid {
			return nil, fmt.Errorf("enforce: issuer key listed as %s has kid %s", kid, receipts.KeyID(pub))
		}
		issuers[kid] = bytes.Clone(pub)
	}
	cache, err := lru.New[string, struct{}](cfg.VerifyCache)
	if err != nil {
		return nil, fmt.Errorf("enforce: verify cache: %w", err)
	}
	return &Authorizer{issuers: issuers, skew: cfg.Skew, verified: cache}, nil
}

// AuthRequest is one call to authorize (seed 002's authorize(capability,
// tool, method, request_hash)), taken from a parsed envelope.
type AuthRequest struct {
	// Chain is the envelope's parsed "capability" member (a tree as
	// encoding/json decodes it with UseNumber: map[string]any, ...), nil
	// if absent. json.RawMessage, []byte and schemas.CapabilityChain (or
	// a pointer to one) are accepted too.
	Chain any
	// ChainHash is hex sha256(JCS(Chain)) as the caller computed it (the
	// receipt's capability_hash); "" to let Authorize compute it. A value
	// that differs from Chain's hash is SIGNATURE_INVALID.
	ChainHash          string
	ServerID, ToolName string
	// Method is the action name for action-based tools, else "".
	Method string
	// Resource is the argument at the tool's resource_pointer, if
	// HasResource.
	Resource    string
	HasResource bool
	// Class is the effective registry class: "read", "write", or "" when
	// unclassified.
	Class string
	// RequestHash is the envelope's request_hash if present, else the
	// computed one: the value the sender signed.
	RequestHash string
	// CorrelationID, SessionID and IssuedAt are the envelope's fields
	// (IssuedAt is the signed "timestamp").
	CorrelationID, SessionID, IssuedAt string
	// SenderSignature is the envelope's parsed sender_signature member,
	// nil if absent.
	SenderSignature any
	// AgentID is the envelope's actor.agent_id ("" if none).
	AgentID string
	// Now is the time to check validity windows at.
	Now time.Time
	// Revoked reports whether a capability id, or "agent:<id>", is
	// revoked; nil means nothing is.
	Revoked func(target string) bool
	// ChainRaw is the capability member as received (optional).
	ChainRaw []byte
	// DeferSender leaves the sender signature's Ed25519 verification to
	// the caller (AuthResult.Sender, AuthResult.SenderVerified).
	DeferSender bool
}

// AuthResult is the outcome of Authorize or VerifyChain.
type AuthResult struct {
	// Codes are the reason codes of every failure found, each once, in a
	// stable order; empty means authorized.
	Codes []string
	// Details say what failed, naming links by index (0 is the root
	// capability, i is delegations[i-1]) and never quoting values.
	Details []string
	// CapabilityIDs are the chain's capability ids, root first, whenever
	// the chain decoded (also when denied).
	CapabilityIDs []string
	// Holder is the agent id of the chain's holder ("" if the chain did
	// not decode).
	Holder string
	// ReadOnly is whether any link carries constraints.read_only.
	ReadOnly bool
	// ChainHash is hex sha256(JCS(chain)), the envelope's capability_hash,
	// whenever the chain decoded ("" otherwise).
	ChainHash string
	// Sender is the sender signature left to verify (DeferSender).
	Sender *receipts.SigCheck
}

// SenderVerified records the outcome of verifying Sender.
func (r *AuthResult) SenderVerified(ok bool) {
	r.Sender = nil
	if ok {
		return
	}
	r.Details = append(r.Details, "sender_signature: does not match the envelope's signed fields")
	for _, c := range r.Codes {
		if c == schemas.CodeSignatureInvalid {
			return
		}
	}
	var codes []string
	for _, c := range codeOrder {
		if c == schemas.CodeSignatureInvalid || slicesContains(r.Codes, c) {
			codes = append(codes, c)
		}
	}
	r.Codes = codes
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// OK reports whether the result authorizes.
func (r AuthResult) OK() bool { return len(r.Codes) == 0 }

// codeOrder is the order AuthResult.Codes are reported in.
var codeOrder = []string{
	schemas.CodeNoCapability,
	schemas.CodeSignatureInvalid,
	schemas.CodeExpired,
	schemas.CodeRevoked,
	schemas.CodeDelegationInvalid,
	schemas.CodeScopeMismatch,
	schemas.CodeToolClassMismatch,
}

// findings collects codes and details, each once.
type findings struct {
	codes   map[string]bool
	details []string
	seen    map[string]bool
}

func (f *findings) add(code, detail string) {
	if f.codes == nil {
		f.codes, f.seen = map[string]bool{}, map[string]bool{}
	}
	f.codes[code] = true
	if detail != "" && !f.seen[detail] {
		f.seen[detail] = true
		f.details = append(f.details, detail)
	}
}

func (f *findings) result(cs *chainState) AuthResult {
	var r AuthResult
	for _, c := range codeOrder {
		if f.codes[c] {
			r.Codes = append(r.Codes, c)
		}
	}
	r.Details = f.details
	if cs != nil {
		r.CapabilityIDs, r.Holder, r.ReadOnly, r.ChainHash = cs.ids, cs.holder, cs.readOnly, cs.hash
	}
	return r
}

// chainState is what a decoded chain yields for the per-request checks.
type chainState struct {
	ids       []string
	holder    string
	holderPub ed25519.PublicKey // nil if the holder's key is malformed
	readOnly  bool
	scopes    []string // the last link's scopes
	leaf      int      // the last link's index
	hash      string   // hex sha256(JCS(chain))
}

// Authorize runs every seed 002 check on one request: the chain (issuer
// and delegation signatures, validity windows, revocation, delegation
// narrowing and linkage), its scope against the call, the sender
// signature over the envelope's signed fields by the holder's key, the
// actor against the holder, and read_only against the tool class. It
// reports every failure. Nothing but verified signatures of immutable
// objects is remembered between calls.
func (a *Authorizer) Authorize(r *AuthRequest) AuthResult {
	var f findings
	if r == nil || r.Chain == nil {
		f.add(schemas.CodeNoCapability, "capability: missing")
		return f.result(nil)
	}
	cs := a.verifyChain(&f, r.Chain, r.Now, r.Revoked)
	if cs != nil {
		if !ScopesCover(cs.scopes, r.ServerID, r.ToolName, r.Method, r.Resource, r.HasResource) {
			f.add(schemas.CodeScopeMismatch, fmt.Sprintf("capability: no scope of link %d covers this call", cs.leaf))
		}
		if r.ChainHash != "" && r.ChainHash != cs.hash {
			f.add(schemas.CodeSignatureInvalid, "capability_hash: differs from sha256(JCS(capability))")
		}
		if r.AgentID != "" && r.AgentID != cs.holder {
			f.add(schemas.CodeSignatureInvalid, "actor.agent_id is not the capability holder")
		}
		if cs.readOnly && r.Class == schemas.ClassWrite {
			f.add(schemas.CodeToolClassMismatch, "capability: constraints.read_only forbids a write tool")
		}
	}
	sender := a.checkSender(&f, r, cs)
	res := f.result(cs)
	res.Sender = sender
	return res
}

// VerifyChain runs Authorize's chain checks only (signatures, validity at
// now, revocation, delegation narrowing and linkage), without a call: no
// scope, sender signature, actor or class check. talosctl cap inspect
// uses it.
func (a *Authorizer) VerifyChain(chain any, now time.Time, revoked func(target string) bool) AuthResult {
	var f findings
	if chain == nil {
		f.add(schemas.CodeNoCapability, "capability: missing")
		return f.result(nil)
	}
	cs := a.verifyChain(&f, chain, now, revoked)
	return f.result(cs)
}

// checkSender verifies the envelope's sender_signature: by the holder's
// key, over EnvelopeSignedFields rebuilt from the request.
func (a *Authorizer) checkSender(f *findings, r *AuthRequest, cs *chainState) *receipts.SigCheck {
	if r.SenderSignature == nil {
		f.add(schemas.CodeSignatureInvalid, "sender_signature: missing")
		return nil
	}
	sig, ok := senderSignature(r.SenderSignature)
	if !ok {
		f.add(schemas.CodeSignatureInvalid, "sender_signature: malformed (want {alg: Ed25519, kid, sig: base64url})")
		return nil
	}
	if cs == nil || cs.holderPub == nil {
		return nil // the chain is already denied; there is no key to verify with
	}
	if sig.kid != receipts.KeyID(cs.holderPub) {
		f.add(schemas.CodeSignatureInvalid, "sender_signature: not by the capability holder's key")
		return nil
	}
	fields := schemas.EnvelopeSignedFields{
		Type:           schemas.EnvelopeSignatureV1,
		CorrelationID:  r.CorrelationID,
		CapabilityHash: cs.hash,
		RequestHash:    r.RequestHash,
		Tool:           r.ServerID + ":" + r.ToolName,
		Method:         schemas.MethodToolsCall,
		Timestamp:      r.IssuedAt,
		SessionID:      r.SessionID,
	}
	sum, err := canonicalSum(&fields)
	if err == nil && r.DeferSender {
		return &receipts.SigCheck{Pub: cs.holderPub, Message: sum[:], Sig: sig.sig}
	}
	if err != nil || !receipts.Verify(cs.holderPub, sum[:], sig.sig) {
		f.add(schemas.CodeSignatureInvalid, "sender_signature: does not match the envelope's signed fields")
	}
	return nil
}

type parsedSig struct {
	kid string
	sig []byte
}

// senderSignature reads a {alg, kid, sig} object (tree or struct) strictly.
func senderSignature(v any) (parsedSig, bool) {
	var s schemas.Signature
	switch x := v.(type) {
	case map[string]any:
		if len(x) != 3 {
			return parsedSig{}, false
		}
		alg, ok1 := x["alg"].(string)
		kid, ok2 := x["kid"].(string)
		sg, ok3 := x["sig"].(string)
		if !ok1 || !ok2 || !ok3 {
			return parsedSig{}, false
		}
		s = schemas.Signature{Alg: alg, KID: kid, Sig: sg}
	case schemas.Signature:
		s = x
	case *schemas.Signature:
		if x == nil {
			return parsedSig{}, false
		}
		s = *x
	default:
		return parsedSig{}, false
	}
	return decodeSig(&s)
}

func decodeSig(s *schemas.Signature) (parsedSig, bool) {
	if s == nil || s.Alg != schemas.SignatureAlg || s.KID == "" {
		return parsedSig{}, false
	}
	raw, err := b64.DecodeString(s.Sig)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return parsedSig{}, false
	}
	return parsedSig{kid: s.KID, sig: raw}, true
}

// errNotCanonical is chainTree's error for input without an RFC 8785 form
// (the underlying error may quote a value, so it is not passed on).
var errNotCanonical = errors.New("not canonicalizable JSON")

// chainTree turns an accepted Chain value into its decoded tree and its
// RFC 8785 bytes.
func chainTree(chain any) (map[string]any, []byte, error) {
	var raw []byte
	switch c := chain.(type) {
	case map[string]any:
		b, err := receipts.CanonicalTree(c)
		if err != nil {
			return nil, nil, errNotCanonical
		}
		return c, b, nil
	case json.RawMessage:
		raw = c
	case []byte:
		raw = c
	case schemas.CapabilityChain:
		return chainTree(&c)
	case *schemas.CapabilityChain:
		if c == nil {
			return nil, nil, errors.New("not a capability chain object")
		}
		b, err := receipts.MarshalCanonical(c)
		if err != nil {
			return nil, nil, errNotCanonical
		}
		raw = b
	default:
		return nil, nil, errors.New("not a capability chain object")
	}
	canon, err := receipts.Canonicalize(raw) // rejects duplicate keys
	if err != nil {
		return nil, nil, errNotCanonical
	}
	d := json.NewDecoder(bytes.NewReader(canon))
	d.UseNumber()
	var tree map[string]any
	if err := d.Decode(&tree); err != nil || tree == nil {
		return nil, nil, errors.New("not a capability chain object")
	}
	return tree, canon, nil
}

// decodable matches the schema details that leave the chain decodable, so
// that every other check still runs: malformed scopes (they cover nothing
// at the root and are contained nowhere in a delegation) and too many
// delegations.
var decodable = regexp.MustCompile(`^/(capability/scopes|delegations/[0-9]+/child_scope)(/[0-9]+)?: |^/delegations: maxItems$`)

// verifyChain decodes and checks the chain, adding findings; it returns
// nil if the chain did not decode (nothing more can be checked).
func (a *Authorizer) verifyChain(f *findings, chain any, now time.Time, revoked func(string) bool) *chainState {
	tree, canon, err := chainTree(chain)
	if err != nil {
		f.add(schemas.CodeSignatureInvalid, "capability: "+err.Error())
		return nil
	}
	sum := sha256.Sum256(canon)
	schemaKey := "schema\x00" + string(sum[:])
	if _, ok := a.verified.Get(schemaKey); ok {
		// These exact bytes matched the schema before.
	} else if err := schemas.ValidateCapabilityChain(canon); err != nil {
		var ve *schemas.ValidationError
		if !errors.As(err, &ve) {
			f.add(schemas.CodeSignatureInvalid, "capability: cannot be validated")
			return nil
		}
		isDecodable := true
		for _, d := range ve.Details {
			// Schema details are pointers into the chain; say where the
			// chain sits in the envelope.
			where := "/capability: " + d
			if strings.HasPrefix(d, "/:") {
				where = "/capability" + d[1:]
			} else if strings.HasPrefix(d, "/") {
				where = "/capability" + d
			}
			switch {
			case decodable.MatchString(d) && strings.HasPrefix(d, "/capability/"):
				f.add(schemas.CodeScopeMismatch, where)
			case strings.HasPrefix(d, "/delegations"):
				f.add(schemas.CodeDelegationInvalid, where)
				isDecodable = isDecodable && decodable.MatchString(d)
			default:
				f.add(schemas.CodeSignatureInvalid, where)
				isDecodable = false
			}
		}
		if !isDecodable {
			return nil
		}
	} else {
		a.verified.Add(schemaKey, struct{}{})
	}
	var c schemas.CapabilityChain
	if err := json.Unmarshal(canon, &c); err != nil {
		f.add(schemas.CodeSignatureInvalid, "capability: does not decode")
		return nil
	}
	rootTree, _ := tree["capability"].(map[string]any)
	delegTrees, _ := tree["delegations"].([]any)
	if rootTree == nil || len(delegTrees) != len(c.Delegations) {
		f.add(schemas.CodeSignatureInvalid, "capability: does not decode")
		return nil
	}
	cs := &chainState{hash: hex.EncodeToString(sum[:])}
	if len(c.Delegations) > schemas.MaxDelegationDepth {
		f.add(schemas.CodeDelegationInvalid, fmt.Sprintf("capability: %d delegations, more than %d", len(c.Delegations), schemas.MaxDelegationDepth))
	}

	// Link 0: the root capability, signed by a trusted issuer.
	root := &c.Capability
	parentHash := objectHash(rootTree) // "" if it cannot be canonicalized
	cs.ids = append(cs.ids, root.CapabilityID)
	if root.Type != schemas.CapabilityTypeV1 {
		f.add(schemas.CodeSignatureInvalid, "link 0: type is not "+schemas.CapabilityTypeV1)
	} else if sig, ok := decodeSig(root.Signature); !ok {
		f.add(schemas.CodeSignatureInvalid, "link 0: signature is malformed")
	} else if pub, trusted := a.issuers[sig.kid]; !trusted {
		f.add(schemas.CodeSignatureInvalid, "link 0: signed by an untrusted issuer key")
	} else if !a.verifyObject(rootTree, parentHash, pub, sig.sig) {
		f.add(schemas.CodeSignatureInvalid, "link 0: issuer signature does not verify")
	}
	a.checkWindow(f, 0, root.IssuedAt, root.ExpiresAt, now)
	checkRevoked(f, revoked, 0, root.CapabilityID, root.Subject)
	holder, holderKey := root.Subject, root.SubjectPublicKey
	scopes, issued, expires := root.Scopes, root.IssuedAt, root.ExpiresAt
	readOnly := root.Constraints != nil && root.Constraints.ReadOnly

	// Links 1..n: each delegation, signed by its parent's holder.
	for i := range c.Delegations {
		link := i + 1
		d := &c.Delegations[i]
		dTree, _ := delegTrees[i].(map[string]any)
		dHash := objectHash(dTree)
		cs.ids = append(cs.ids, d.CapabilityID)
		holderPub, keyErr := ParsePublicKeyString(holderKey)
		switch sig, ok := decodeSig(d.Signature); {
		case d.Type != schemas.DelegationTypeV1:
			f.add(schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: type is not %s", link, schemas.DelegationTypeV1))
		case !ok:
			f.add(schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: signature is malformed", link))
		case keyErr != nil:
			f.add(schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: the parent's holder public key is malformed", link))
		case sig.kid != receipts.KeyID(holderPub):
			f.add(schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: not signed by the parent's holder key", link))
		case !a.verifyObject(dTree, dHash, holderPub, sig.sig):
			f.add(schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: delegator signature does not verify", link))
		}
		if parentHash == "" || parentHash != d.ParentCapabilityHash {
			f.add(schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: parent_capability_hash is not the hash of link %d", link, link-1))
		}
		if d.DelegatorID != holder {
			f.add(schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: delegator_id is not the holder of link %d", link, link-1))
		}
		for j, s := range d.ChildScope {
			if !scopeContained(scopes, s) {
				f.add(schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: child_scope[%d] is not contained in the scopes of link %d", link, j, link-1))
			}
		}
		childRO := d.Constraints != nil && d.Constraints.ReadOnly
		if readOnly && !childRO {
			f.add(schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: drops the read_only constraint of its parent", link))
		}
		dIssued, e1 := parseTime(d.IssuedAt)
		pIssued, e2 := parseTime(issued)
		if e1 != nil || e2 != nil || dIssued.Before(pIssued) {
			f.add(schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: issued_at is before that of link %d", link, link-1))
		}
		dExpires, e1 := parseTime(d.ExpiresAt)
		pExpires, e2 := parseTime(expires)
		if e1 != nil || e2 != nil || dExpires.After(pExpires) {
			f.add(schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: expires_at is after that of link %d (outlives its parent)", link, link-1))
		}
		a.checkWindow(f, link, d.IssuedAt, d.ExpiresAt, now)
		checkRevoked(f, revoked, link, d.CapabilityID, d.DelegatorID, d.DelegateeID)
		holder, holderKey = d.DelegateeID, d.DelegateePublicKey
		scopes, issued, expires = d.ChildScope, d.IssuedAt, d.ExpiresAt
		readOnly = readOnly || childRO
		parentHash = dHash
	}
	cs.holder, cs.readOnly, cs.scopes, cs.leaf = holder, readOnly, scopes, len(c.Delegations)
	if pub, err := ParsePublicKeyString(holderKey); err == nil {
		cs.holderPub = pub
	} else {
		f.add(schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: the holder public key is malformed", cs.leaf))
	}
	return cs
}

// objectHash is CapabilityObjectHash of a link's tree, "" if it has none.
func objectHash(obj map[string]any) string {
	if obj == nil {
		return ""
	}
	h, err := CapabilityObjectHash(obj)
	if err != nil {
		return ""
	}
	return h
}

// verifyObject verifies sig over sha256(JCS(obj without "signature")) by
// pub, consulting and filling the cache of verified objects; hash is
// objectHash(obj), the cache key with pub.
func (a *Authorizer) verifyObject(obj map[string]any, hash string, pub ed25519.PublicKey, sig []byte) bool {
	if hash == "" {
		return false
	}
	key := hash + "\x00" + string(pub)
	if _, ok := a.verified.Get(key); ok {
		return true
	}
	unsigned := make(map[string]any, len(obj))
	for k, v := range obj {
		if k != "signature" {
			unsigned[k] = v
		}
	}
	pre, err := receipts.CanonicalTree(unsigned)
	if err != nil {
		return false
	}
	digest := sha256.Sum256(pre)
	if !ed25519.Verify(pub, digest[:], sig) {
		return false
	}
	a.verified.Add(key, struct{}{})
	return true
}

// checkWindow adds EXPIRED unless issued_at - skew <= now <= expires_at + skew.
func (a *Authorizer) checkWindow(f *findings, link int, issuedAt, expiresAt string, now time.Time) {
	issued, err1 := parseTime(issuedAt)
	expires, err2 := parseTime(expiresAt)
	switch {
	case err1 != nil || err2 != nil:
		f.add(schemas.CodeExpired, fmt.Sprintf("link %d: issued_at or expires_at is not an RFC 3339 time", link))
	case !expires.After(issued):
		f.add(schemas.CodeExpired, fmt.Sprintf("link %d: expires_at is not after issued_at (never valid)", link))
	case now.Before(issued.Add(-a.skew)):
		f.add(schemas.CodeExpired, fmt.Sprintf("link %d: not valid yet (issued_at is in the future beyond the skew)", link))
	case now.After(expires.Add(a.skew)):
		f.add(schemas.CodeExpired, fmt.Sprintf("link %d: expired", link))
	}
}

// checkRevoked adds REVOKED if the link's capability id or any of its
// agents is revoked.
func checkRevoked(f *findings, revoked func(string) bool, link int, capID string, agents ...string) {
	if revoked == nil {
		return
	}
	if revoked(capID) {
		f.add(schemas.CodeRevoked, fmt.Sprintf("link %d: capability_id is revoked", link))
	}
	for _, ag := range agents {
		if revoked("agent:" + ag) {
			f.add(schemas.CodeRevoked, fmt.Sprintf("link %d: an agent of this link is revoked", link))
		}
	}
}
