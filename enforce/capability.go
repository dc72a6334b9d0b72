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
	"slices"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// CapabilityConfig configures an Authorizer. The zero value trusts no
// issuer and uses the defaults.
type CapabilityConfig struct {
	// Issuers are the trusted issuer keys (kid -> key); empty trusts no
	// issuer, so every capability is SIGNATURE_INVALID.
	Issuers verify.KeySet
	// Skew widens every link's [issued_at, expires_at] on both sides.
	// 0 means DefaultCapabilitySkew (CP-PA1: 60 s).
	Skew time.Duration
	// VerifyCache is how many verified signatures of immutable signed
	// objects (keyed by the object's hash, signature included, and the
	// verifying key) and schema-valid chains (keyed by the hash of their
	// canonical bytes) are remembered; only successes are. Nothing about
	// expiry, revocation, scope or the sender signature is cached. 0 means
	// DefaultVerifyCache.
	VerifyCache int
	// ChainCache is how many entries of verified chains are remembered:
	// everything a chain yields that depends neither on the call nor on
	// the clock (see Authorize). A chain takes one entry under the hash of
	// its canonical bytes and, when the caller passes
	// AuthRequest.ChainRaw, one under the hash of those bytes. Only
	// chains without any finding of their own are kept. 0 means
	// DefaultChainCache.
	ChainCache int
}

// Capability defaults.
const (
	DefaultCapabilitySkew = schemas.CapabilitySkewSeconds * time.Second
	DefaultVerifyCache    = 4096
	DefaultChainCache     = 4096
)

// Authorizer is CP-PA1's CapabilityManager.authorize: it checks an
// envelope's capability chain and sender signature per request. It holds
// only immutable configuration and caches of verified signatures and
// verified chains, so it is safe for concurrent use.
type Authorizer struct {
	issuers verify.KeySet
	skew    time.Duration
	// verified holds objectHash+"\x00"+publicKey for every signature that
	// verified (an object hash covers the signature, so a hit means this
	// exact object was signed by this exact key), and "schema\x00"+sha256
	// of the canonical bytes of every chain that matched the schema.
	verified *lru.Cache[string, struct{}]
	// chains maps a chain's bytes (by sha256) to what decodeChain derived
	// from them; the entries are never modified once added.
	chains *lru.Cache[chainKey, *verifiedChain]
}

// chainKey names a chain in Authorizer.chains: sha256 of its canonical
// bytes, or (raw) of the bytes exactly as received.
type chainKey struct {
	raw bool
	sum [sha256.Size]byte
}

// NewAuthorizer checks cfg and returns an Authorizer. Every issuer kid must
// be the key's verify.KeyID.
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
	if cfg.ChainCache < 0 {
		return nil, errors.New("enforce: capability chain cache size is negative")
	}
	if cfg.ChainCache == 0 {
		cfg.ChainCache = DefaultChainCache
	}
	issuers := make(verify.KeySet, len(cfg.Issuers))
	for kid, pub := range cfg.Issuers {
		if len(pub) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("enforce: issuer key %s is not an Ed25519 public key", kid)
		}
		if verify.KeyID(pub) != kid {
			return nil, fmt.Errorf("enforce: issuer key listed as %s has kid %s", kid, verify.KeyID(pub))
		}
		issuers[kid] = bytes.Clone(pub)
	}
	cache, err := lru.New[string, struct{}](cfg.VerifyCache)
	if err != nil {
		return nil, fmt.Errorf("enforce: verify cache: %w", err)
	}
	chains, err := lru.New[chainKey, *verifiedChain](cfg.ChainCache)
	if err != nil {
		return nil, fmt.Errorf("enforce: chain cache: %w", err)
	}
	return &Authorizer{issuers: issuers, skew: cfg.Skew, verified: cache, chains: chains}, nil
}

// AuthRequest is one call to authorize (CP-PA1's authorize(capability,
// tool, method, request_hash)), taken from a parsed envelope.
type AuthRequest struct {
	// Chain is the envelope's parsed "capability" member (a tree as
	// encoding/json decodes it with UseNumber: map[string]any, ...), nil
	// if absent. json.RawMessage, []byte and schemas.CapabilityChain (or
	// a pointer to one) are accepted too.
	Chain any
	// ChainRaw, if not empty, is the "capability" member's bytes exactly
	// as received, the bytes Chain was decoded from (what
	// schemas.ParseToolCall leaves in ToolCall.Capability). It lets a
	// chain seen before be recognised without canonicalizing Chain; once
	// these bytes have verified, the chain checked is the one they hold.
	// It is ignored when Chain is nil, and not retained.
	ChainRaw []byte
	// ChainHash is hex sha256(JCS(Chain)) as the caller computed it (the
	// receipt's capability_hash); "" to let Authorize compute it. A value
	// that differs from Chain's hash is SIGNATURE_INVALID.
	ChainHash          string
	ServerID, ToolName string
	// Method is the action name for action-based tools, else "".
	Method string
	// MCPMethod is the envelope's mcp_method ("" for tools/call): the
	// method its sender signature names.
	MCPMethod string
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
	// DeferSender leaves the last step, the Ed25519 verification of a
	// well-formed sender signature by the holder's key, to the caller:
	// Authorize returns it in AuthResult.Sender instead of running it, so
	// that a caller holding many results can verify their signatures
	// together (verify.VerifyAll) and report each outcome with
	// AuthResult.SenderVerified.
	DeferSender bool
	// AgentID is the envelope's actor.agent_id ("" if none).
	AgentID string
	// Now is the time to check validity windows at.
	Now time.Time
	// Revoked reports whether a capability id, or "agent:<id>", is
	// revoked; nil means nothing is.
	Revoked func(target string) bool
}

// AuthResult is the outcome of Authorize or VerifyChain.
type AuthResult struct {
	// Codes are the reason codes of every failure found, each once, in a
	// stable order; empty means authorized, unless Sender is pending.
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
	// Sender, set only for a request with DeferSender, is the sender
	// signature still to verify: the signature over the envelope's signed
	// fields by the holder's key. It is nil when there is nothing left to
	// verify (no signature, a malformed one, one by another key, or no
	// holder key); Codes then already say so. While it is set the result
	// is incomplete and OK reports false; the caller MUST verify it
	// (verify.Verify or verify.VerifyAll) and pass the outcome to
	// SenderVerified. Its byte slices MUST NOT be modified.
	Sender *verify.SigCheck
}

// OK reports whether the result authorizes: no failure, and no sender
// signature left to verify.
func (r AuthResult) OK() bool { return len(r.Codes) == 0 && r.Sender == nil }

// SenderVerified records the outcome of verifying r.Sender, making r what
// Authorize would have returned without DeferSender: a signature that does
// not verify adds SIGNATURE_INVALID (in its place among Codes) and its
// detail (after every other). It clears Sender; with Sender nil it does
// nothing.
func (r *AuthResult) SenderVerified(ok bool) {
	if r.Sender == nil {
		return
	}
	r.Sender = nil
	if ok {
		return
	}
	if !slices.Contains(r.Codes, schemas.CodeSignatureInvalid) {
		at := codeIndex(schemas.CodeSignatureInvalid)
		i := 0
		for i < len(r.Codes) && codeIndex(r.Codes[i]) < at {
			i++
		}
		r.Codes = slices.Insert(r.Codes, i, schemas.CodeSignatureInvalid)
	}
	if !slices.Contains(r.Details, detailSenderMismatch) {
		r.Details = append(r.Details, detailSenderMismatch)
	}
}

// detailSenderMismatch is the detail of a sender signature that does not
// verify.
const detailSenderMismatch = "sender_signature: does not match the envelope's signed fields"

// codeOrder is the order AuthResult.Codes are reported in.
var codeOrder = [...]string{
	schemas.CodeNoCapability,
	schemas.CodeSignatureInvalid,
	schemas.CodeExpired,
	schemas.CodeRevoked,
	schemas.CodeDelegationInvalid,
	schemas.CodeScopeMismatch,
	schemas.CodeToolClassMismatch,
}

// codeIndex is code's position in codeOrder, -1 if it has none.
func codeIndex(code string) int {
	for i, c := range codeOrder {
		if c == code {
			return i
		}
	}
	return -1
}

// finding is one failure: a reason code and its detail.
type finding struct {
	code, detail string
}

// maxLinearDetails is how many details findings deduplicates by scanning
// before it keeps a set (a chain that fails its schema can have many).
const maxLinearDetails = 16

// findings collects codes and details, each once.
type findings struct {
	codes   uint8 // bit i set: codeOrder[i] was found
	details []string
	seen    map[string]struct{} // every detail, once there are many
}

func (f *findings) add(code, detail string) {
	if i := codeIndex(code); i >= 0 {
		f.codes |= 1 << i
	}
	if detail == "" {
		return
	}
	if f.seen != nil {
		if _, dup := f.seen[detail]; dup {
			return
		}
		f.seen[detail] = struct{}{}
	} else if slices.Contains(f.details, detail) {
		return
	} else if len(f.details) == maxLinearDetails {
		f.seen = make(map[string]struct{}, 2*maxLinearDetails)
		for _, d := range f.details {
			f.seen[d] = struct{}{}
		}
		f.seen[detail] = struct{}{}
	}
	f.details = append(f.details, detail)
}

func (f *findings) addAll(fs []finding) {
	for _, x := range fs {
		f.add(x.code, x.detail)
	}
}

func (f *findings) result(vc *verifiedChain) AuthResult {
	var r AuthResult
	for i, c := range codeOrder {
		if f.codes&(1<<i) != 0 {
			r.Codes = append(r.Codes, c)
		}
	}
	r.Details = f.details
	if vc != nil {
		r.CapabilityIDs = slices.Clone(vc.ids)
		r.Holder, r.ReadOnly, r.ChainHash = vc.holder, vc.readOnly, vc.hash
	}
	return r
}

// verifiedChain is everything a decoded chain yields that depends on its
// bytes alone, in the form the per-call checks use. Its findings are kept
// where Authorize reports them relative to the per-call ones: before the
// links, per link (before the link's validity window and revocation), and
// after the links. It is shared between calls and never modified once
// built.
type verifiedChain struct {
	hash      string // hex sha256(JCS(chain))
	ids       []string
	holder    string
	holderPub ed25519.PublicKey // nil if the holder's key is malformed
	holderKID string            // verify.KeyID(holderPub)
	readOnly  bool
	scopes    []Scope // the last link's scopes that parse
	leaf      int     // the last link's index
	pre       []finding
	links     []chainLink
	post      []finding
}

// chainLink is what the per-call checks need of one link.
type chainLink struct {
	static []finding // signature and delegation findings
	// notBefore and notAfter are issued_at - skew and expires_at + skew;
	// badWindow, if set, is the EXPIRED detail of a window that is never
	// valid.
	notBefore, notAfter time.Time
	badWindow           string
	// capID and agents ("agent:<id>") are the revocation targets.
	capID  string
	agents []string
}

// clean reports whether the chain has no finding of its own, so that only
// the call and the clock can deny it.
func (vc *verifiedChain) clean() bool {
	if len(vc.pre) > 0 || len(vc.post) > 0 {
		return false
	}
	for i := range vc.links {
		if len(vc.links[i].static) > 0 || vc.links[i].badWindow != "" {
			return false
		}
	}
	return true
}

// Authorize runs every CP-PA1 check on one request: the chain (issuer
// and delegation signatures, validity windows, revocation, delegation
// narrowing and linkage), its scope against the call, the sender
// signature over the envelope's signed fields by the holder's key, the
// actor against the holder, and read_only against the tool class. It
// reports every failure.
//
// What a chain yields independently of the call and the clock (its
// decoding, schema, signatures, linkage, narrowing, hash, holder and
// holder key) is remembered for chains without a finding of their own,
// keyed by the chain's bytes; the validity windows, revocation, scope,
// actor, class and sender signature are checked on every call. The
// result is the same with and without the cache, and with and without
// ChainRaw.
func (a *Authorizer) Authorize(r *AuthRequest) AuthResult {
	var f findings
	if r == nil || r.Chain == nil {
		f.add(schemas.CodeNoCapability, "capability: missing")
		return f.result(nil)
	}
	vc := a.chain(&f, r.Chain, r.ChainRaw)
	if vc != nil {
		a.checkChain(&f, vc, r.Now, r.Revoked)
		if !scopesCover(vc.scopes, r.ServerID, r.ToolName, r.Method, r.Resource, r.HasResource) {
			f.add(schemas.CodeScopeMismatch, fmt.Sprintf("capability: no scope of link %d covers this call", vc.leaf))
		}
		if r.ChainHash != "" && r.ChainHash != vc.hash {
			f.add(schemas.CodeSignatureInvalid, "capability_hash: differs from sha256(JCS(capability))")
		}
		if r.AgentID != "" && r.AgentID != vc.holder {
			f.add(schemas.CodeSignatureInvalid, "actor.agent_id is not the capability holder")
		}
		if vc.readOnly && r.Class == schemas.ClassWrite {
			f.add(schemas.CodeToolClassMismatch, "capability: constraints.read_only forbids a write tool")
		}
	}
	sender := a.checkSender(&f, r, vc)
	res := f.result(vc)
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
	vc := a.chain(&f, chain, nil)
	if vc != nil {
		a.checkChain(&f, vc, now, revoked)
	}
	return f.result(vc)
}

// chain returns chain's verifiedChain, from the cache (by raw, then by its
// canonical bytes) or built and, if clean, cached; nil (with the reasons
// added to f) if the chain does not decode.
func (a *Authorizer) chain(f *findings, chain any, raw []byte) *verifiedChain {
	var rawKey chainKey
	if len(raw) > 0 {
		rawKey = chainKey{raw: true, sum: sha256.Sum256(raw)}
		if vc, ok := a.chains.Get(rawKey); ok {
			return vc
		}
	}
	tree, canon, err := chainTree(chain)
	if err != nil {
		f.add(schemas.CodeSignatureInvalid, "capability: "+err.Error())
		return nil
	}
	canonKey := chainKey{sum: sha256.Sum256(canon)}
	vc, ok := a.chains.Get(canonKey)
	if !ok {
		var early []finding
		if vc, early = a.decodeChain(tree, canon, canonKey.sum); vc == nil {
			f.addAll(early)
			return nil
		}
		if !vc.clean() {
			return vc
		}
		a.chains.Add(canonKey, vc)
	}
	// raw names this chain only if it canonicalizes to the bytes verified.
	if len(raw) > 0 && (sameBytes(chain, raw) || canonicalOf(raw, canon)) {
		a.chains.Add(rawKey, vc)
	}
	return vc
}

// sameBytes reports whether chain is given as exactly the bytes raw.
func sameBytes(chain any, raw []byte) bool {
	switch c := chain.(type) {
	case json.RawMessage:
		return bytes.Equal(c, raw)
	case []byte:
		return bytes.Equal(c, raw)
	}
	return false
}

// canonicalOf reports whether raw's RFC 8785 form is canon.
func canonicalOf(raw, canon []byte) bool {
	c, err := jsonkit.Canonicalize(raw)
	return err == nil && bytes.Equal(c, canon)
}

// checkChain adds the findings of vc: its own, and those of each link's
// validity window at now and revocation, in link order.
func (a *Authorizer) checkChain(f *findings, vc *verifiedChain, now time.Time, revoked func(string) bool) {
	f.addAll(vc.pre)
	for i := range vc.links {
		l := &vc.links[i]
		f.addAll(l.static)
		switch {
		case l.badWindow != "":
			f.add(schemas.CodeExpired, l.badWindow)
		case now.Before(l.notBefore):
			f.add(schemas.CodeExpired, fmt.Sprintf("link %d: not valid yet (issued_at is in the future beyond the skew)", i))
		case now.After(l.notAfter):
			f.add(schemas.CodeExpired, fmt.Sprintf("link %d: expired", i))
		}
		if revoked == nil {
			continue
		}
		if revoked(l.capID) {
			f.add(schemas.CodeRevoked, fmt.Sprintf("link %d: capability_id is revoked", i))
		}
		for _, ag := range l.agents {
			if revoked(ag) {
				f.add(schemas.CodeRevoked, fmt.Sprintf("link %d: an agent of this link is revoked", i))
			}
		}
	}
	f.addAll(vc.post)
}

// scopesCover reports whether any of scopes covers the call.
func scopesCover(scopes []Scope, server, tool, method, resource string, hasResource bool) bool {
	for i := range scopes {
		if scopes[i].Covers(server, tool, method, resource, hasResource) {
			return true
		}
	}
	return false
}

// checkSender checks the envelope's sender_signature: by the holder's key,
// over EnvelopeSignedFields rebuilt from the request. With r.DeferSender
// it returns the final signature verification instead of running it.
func (a *Authorizer) checkSender(f *findings, r *AuthRequest, vc *verifiedChain) *verify.SigCheck {
	if r.SenderSignature == nil {
		f.add(schemas.CodeSignatureInvalid, "sender_signature: missing")
		return nil
	}
	var sig [ed25519.SignatureSize]byte
	kid, ok := senderSignature(r.SenderSignature, &sig)
	if !ok {
		f.add(schemas.CodeSignatureInvalid, "sender_signature: malformed (want {alg: Ed25519, kid, sig: base64url})")
		return nil
	}
	if vc == nil || vc.holderPub == nil {
		return nil // the chain is already denied; there is no key to verify with
	}
	if kid != vc.holderKID {
		f.add(schemas.CodeSignatureInvalid, "sender_signature: not by the capability holder's key")
		return nil
	}
	fields := schemas.EnvelopeSignedFields{
		Type:           schemas.EnvelopeSignatureV1,
		CorrelationID:  r.CorrelationID,
		CapabilityHash: vc.hash,
		RequestHash:    r.RequestHash,
		Tool:           r.ServerID + ":" + r.ToolName,
		Method:         schemas.MethodOf(r.MCPMethod),
		Timestamp:      r.IssuedAt,
		SessionID:      r.SessionID,
	}
	sum := envelopeDigest(&fields)
	if r.DeferSender {
		p := &pendingSender{sum: sum, sig: sig}
		p.check = verify.SigCheck{Pub: vc.holderPub, Message: p.sum[:], Sig: p.sig[:]}
		return &p.check
	}
	if !verify.Verify(vc.holderPub, sum[:], sig[:]) {
		f.add(schemas.CodeSignatureInvalid, detailSenderMismatch)
	}
	return nil
}

// pendingSender holds a deferred sender check and the bytes it points
// into, in one allocation.
type pendingSender struct {
	check verify.SigCheck
	sum   [sha256.Size]byte
	sig   [ed25519.SignatureSize]byte
}

// senderSignature reads a {alg, kid, sig} object (tree or struct)
// strictly, decoding the signature into sig.
func senderSignature(v any, sig *[ed25519.SignatureSize]byte) (kid string, ok bool) {
	var s schemas.Signature
	switch x := v.(type) {
	case map[string]any:
		if len(x) != 3 {
			return "", false
		}
		alg, ok1 := x["alg"].(string)
		kid, ok2 := x["kid"].(string)
		sg, ok3 := x["sig"].(string)
		if !ok1 || !ok2 || !ok3 {
			return "", false
		}
		s = schemas.Signature{Alg: alg, KID: kid, Sig: sg}
	case schemas.Signature:
		s = x
	case *schemas.Signature:
		if x == nil {
			return "", false
		}
		s = *x
	default:
		return "", false
	}
	return decodeSigInto(&s, sig)
}

type parsedSig struct {
	kid string
	sig []byte
}

func decodeSig(s *schemas.Signature) (parsedSig, bool) {
	var sig [ed25519.SignatureSize]byte
	kid, ok := decodeSigInto(s, &sig)
	if !ok {
		return parsedSig{}, false
	}
	return parsedSig{kid: kid, sig: sig[:]}, true
}

// decodeSigInto checks s's algorithm and kid and decodes its signature
// (base64url without padding, strictly, exactly 64 bytes) into sig.
func decodeSigInto(s *schemas.Signature, sig *[ed25519.SignatureSize]byte) (string, bool) {
	if s == nil || s.Alg != schemas.SignatureAlg || s.KID == "" {
		return "", false
	}
	if len(s.Sig) == b64.EncodedLen(ed25519.SignatureSize) {
		// The usual form, decoded in place.
		n, err := b64.Decode(sig[:], []byte(s.Sig))
		if err != nil || n != ed25519.SignatureSize {
			return "", false
		}
		return s.KID, true
	}
	// Other lengths can still decode to 64 bytes (the decoder skips line
	// breaks), and are accepted as before.
	raw, err := b64.DecodeString(s.Sig)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return "", false
	}
	copy(sig[:], raw)
	return s.KID, true
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
		b, err := jsonkit.CanonicalTree(c)
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
		b, err := jsonkit.MarshalCanonical(c)
		if err != nil {
			return nil, nil, errNotCanonical
		}
		raw = b
	default:
		return nil, nil, errors.New("not a capability chain object")
	}
	canon, err := jsonkit.Canonicalize(raw) // rejects duplicate keys
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

// decodeChain runs every check of the chain whose outcome depends on its
// canonical bytes alone (sum is their sha256; tree is their decoded form):
// the schema, issuer and delegation signatures, linkage and narrowing, and
// the holder key; it also prepares each link's validity window and
// revocation targets. It returns nil and the reasons if the chain does not
// decode (nothing more can be checked).
func (a *Authorizer) decodeChain(tree map[string]any, canon []byte, sum [sha256.Size]byte) (*verifiedChain, []finding) {
	pre, ok := a.checkChainSchema(canon, sum)
	if !ok {
		return nil, pre
	}
	var c schemas.CapabilityChain
	if err := json.Unmarshal(canon, &c); err != nil {
		addFinding(&pre, schemas.CodeSignatureInvalid, "capability: does not decode")
		return nil, pre
	}
	rootTree, _ := tree["capability"].(map[string]any)
	delegTrees, _ := tree["delegations"].([]any)
	if rootTree == nil || len(delegTrees) != len(c.Delegations) {
		addFinding(&pre, schemas.CodeSignatureInvalid, "capability: does not decode")
		return nil, pre
	}
	vc := &verifiedChain{
		hash:  hex.EncodeToString(sum[:]),
		ids:   make([]string, 0, 1+len(c.Delegations)),
		links: make([]chainLink, 1+len(c.Delegations)),
	}
	if len(c.Delegations) > schemas.MaxDelegationDepth {
		addFinding(&pre, schemas.CodeDelegationInvalid, fmt.Sprintf("capability: %d delegations, more than %d", len(c.Delegations), schemas.MaxDelegationDepth))
	}
	vc.pre = pre

	// Link 0: the root capability, signed by a trusted issuer.
	vc.ids = append(vc.ids, c.Capability.CapabilityID)
	parent := a.checkRoot(&vc.links[0], &c.Capability, rootTree)

	// Links 1..n: each delegation, signed by its parent's holder.
	for i := range c.Delegations {
		d := &c.Delegations[i]
		dTree, _ := delegTrees[i].(map[string]any)
		vc.ids = append(vc.ids, d.CapabilityID)
		parent = a.checkDelegation(&vc.links[i+1], i+1, d, dTree, parent)
	}
	vc.setLeaf(&c)
	return vc, nil
}

// addFinding appends a finding of code with detail to *dst.
func addFinding(dst *[]finding, code, detail string) { *dst = append(*dst, finding{code, detail}) }

// checkChainSchema matches canon (sum is its sha256) against the capability
// chain schema, remembering bytes that match. It returns the findings, and
// whether the chain still decodes: false unless every detail is one
// decodable allows.
func (a *Authorizer) checkChainSchema(canon []byte, sum [sha256.Size]byte) ([]finding, bool) {
	schemaKey := "schema\x00" + string(sum[:])
	if _, ok := a.verified.Get(schemaKey); ok {
		return nil, true // these exact bytes matched the schema before
	}
	err := schemas.ValidateCapabilityChain(canon)
	if err == nil {
		a.verified.Add(schemaKey, struct{}{})
		return nil, true
	}
	var pre []finding
	var ve *schemas.ValidationError
	if !errors.As(err, &ve) {
		addFinding(&pre, schemas.CodeSignatureInvalid, "capability: cannot be validated")
		return pre, false
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
			addFinding(&pre, schemas.CodeScopeMismatch, where)
		case strings.HasPrefix(d, "/delegations"):
			addFinding(&pre, schemas.CodeDelegationInvalid, where)
			isDecodable = isDecodable && decodable.MatchString(d)
		default:
			addFinding(&pre, schemas.CodeSignatureInvalid, where)
			isDecodable = false
		}
	}
	return pre, isDecodable
}

// parentLink is what the next delegation is checked against: the link
// before it.
type parentLink struct {
	hash              string // objectHash of the link's tree, "" if it has none
	holder, holderKey string // who the link is for, and that holder's public key
	scopes            []string
	issued, expires   string
	readOnly          bool // set if this link or any before it is read_only
}

// checkRoot checks link 0, the root capability root (tree is its decoded
// form): its type, and its signature by a trusted issuer; it fills l and
// returns the root as the parent of link 1.
func (a *Authorizer) checkRoot(l *chainLink, root *schemas.Capability, tree map[string]any) parentLink {
	hash := objectHash(tree) // "" if it cannot be canonicalized
	if root.Type != schemas.CapabilityTypeV1 {
		addFinding(&l.static, schemas.CodeSignatureInvalid, "link 0: type is not "+schemas.CapabilityTypeV1)
	} else if sig, ok := decodeSig(root.Signature); !ok {
		addFinding(&l.static, schemas.CodeSignatureInvalid, "link 0: signature is malformed")
	} else if pub, trusted := a.issuers[sig.kid]; !trusted {
		addFinding(&l.static, schemas.CodeSignatureInvalid, "link 0: signed by an untrusted issuer key")
	} else if !a.verifyObject(tree, hash, pub, sig.sig) {
		addFinding(&l.static, schemas.CodeSignatureInvalid, "link 0: issuer signature does not verify")
	}
	a.prepareLink(l, 0, root.IssuedAt, root.ExpiresAt, root.CapabilityID, root.Subject)
	return parentLink{
		hash:      hash,
		holder:    root.Subject,
		holderKey: root.SubjectPublicKey,
		scopes:    root.Scopes,
		issued:    root.IssuedAt,
		expires:   root.ExpiresAt,
		readOnly:  root.Constraints.IsReadOnly(),
	}
}

// checkDelegation checks link (1..n), the delegation d (tree is its decoded
// form), against its parent: its type and its signature by the parent's
// holder key; that it names the parent by hash and by holder; and that it
// narrows the parent (scopes contained, read_only kept, validity within
// the parent's). It fills l and returns d as the parent of the next link.
func (a *Authorizer) checkDelegation(l *chainLink, link int, d *schemas.Delegation, tree map[string]any, parent parentLink) parentLink {
	hash := objectHash(tree)
	holderPub, keyErr := ParsePublicKeyString(parent.holderKey)
	switch sig, ok := decodeSig(d.Signature); {
	case d.Type != schemas.DelegationTypeV1:
		addFinding(&l.static, schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: type is not %s", link, schemas.DelegationTypeV1))
	case !ok:
		addFinding(&l.static, schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: signature is malformed", link))
	case keyErr != nil:
		addFinding(&l.static, schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: the parent's holder public key is malformed", link))
	case sig.kid != verify.KeyID(holderPub):
		addFinding(&l.static, schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: not signed by the parent's holder key", link))
	case !a.verifyObject(tree, hash, holderPub, sig.sig):
		addFinding(&l.static, schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: delegator signature does not verify", link))
	}
	if parent.hash == "" || parent.hash != d.ParentCapabilityHash {
		addFinding(&l.static, schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: parent_capability_hash is not the hash of link %d", link, link-1))
	}
	if d.DelegatorID != parent.holder {
		addFinding(&l.static, schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: delegator_id is not the holder of link %d", link, link-1))
	}
	for j, s := range d.ChildScope {
		if !scopeContained(parent.scopes, s) {
			addFinding(&l.static, schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: child_scope[%d] is not contained in the scopes of link %d", link, j, link-1))
		}
	}
	childRO := d.Constraints.IsReadOnly()
	if parent.readOnly && !childRO {
		addFinding(&l.static, schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: drops the read_only constraint of its parent", link))
	}
	dIssued, e1 := parseTime(d.IssuedAt)
	pIssued, e2 := parseTime(parent.issued)
	if e1 != nil || e2 != nil || dIssued.Before(pIssued) {
		addFinding(&l.static, schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: issued_at is before that of link %d", link, link-1))
	}
	dExpires, e1 := parseTime(d.ExpiresAt)
	pExpires, e2 := parseTime(parent.expires)
	if e1 != nil || e2 != nil || dExpires.After(pExpires) {
		addFinding(&l.static, schemas.CodeDelegationInvalid, fmt.Sprintf("link %d: expires_at is after that of link %d (outlives its parent)", link, link-1))
	}
	a.prepareLink(l, link, d.IssuedAt, d.ExpiresAt, d.CapabilityID, d.DelegatorID, d.DelegateeID)
	return parentLink{
		hash:      hash,
		holder:    d.DelegateeID,
		holderKey: d.DelegateePublicKey,
		scopes:    d.ChildScope,
		issued:    d.IssuedAt,
		expires:   d.ExpiresAt,
		readOnly:  parent.readOnly || childRO,
	}
}

// setLeaf fills in what the per-call checks need of c's last link: its
// holder and holder key, read_only, and the scopes that parse.
func (vc *verifiedChain) setLeaf(c *schemas.CapabilityChain) {
	vc.holder, vc.readOnly, vc.leaf = c.Holder(), c.ReadOnly(), len(c.Delegations)
	for _, s := range c.Scopes() {
		if sc, err := ParseScope(s); err == nil { // malformed scopes cover nothing
			vc.scopes = append(vc.scopes, sc)
		}
	}
	if pub, err := ParsePublicKeyString(c.HolderPublicKey()); err == nil {
		vc.holderPub, vc.holderKID = pub, verify.KeyID(pub)
	} else {
		addFinding(&vc.post, schemas.CodeSignatureInvalid, fmt.Sprintf("link %d: the holder public key is malformed", vc.leaf))
	}
}

// prepareLink fills l's validity window (EXPIRED unless issued_at - skew
// <= now <= expires_at + skew) and its revocation targets: the link's
// capability id and each of its agents.
func (a *Authorizer) prepareLink(l *chainLink, link int, issuedAt, expiresAt, capID string, agents ...string) {
	issued, err1 := parseTime(issuedAt)
	expires, err2 := parseTime(expiresAt)
	switch {
	case err1 != nil || err2 != nil:
		l.badWindow = fmt.Sprintf("link %d: issued_at or expires_at is not an RFC 3339 time", link)
	case !expires.After(issued):
		l.badWindow = fmt.Sprintf("link %d: expires_at is not after issued_at (never valid)", link)
	default:
		l.notBefore, l.notAfter = issued.Add(-a.skew), expires.Add(a.skew)
	}
	l.capID = capID
	l.agents = make([]string, len(agents))
	for i, ag := range agents {
		l.agents[i] = "agent:" + ag
	}
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
	pre, err := jsonkit.CanonicalTree(unsigned)
	if err != nil {
		return false
	}
	digest := sha256.Sum256(pre)
	if !verify.Verify(pub, digest[:], sig) {
		return false
	}
	a.verified.Add(key, struct{}{})
	return true
}
