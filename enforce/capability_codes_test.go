package enforce

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// TestAuthorizeCodes: each check yields its code, alone when it is the
// only thing wrong, with a detail that names the link.
func TestAuthorizeCodes(t *testing.T) {
	a := capAuthorizer(t)
	const (
		sigInvalid = schemas.CodeSignatureInvalid
		expired    = schemas.CodeExpired
		revoked    = schemas.CodeRevoked
		delegInv   = schemas.CodeDelegationInvalid
		scopeMis   = schemas.CodeScopeMismatch
		classMis   = schemas.CodeToolClassMismatch
	)
	reqOf := func(b capBuild) func(t *testing.T) *AuthRequest {
		return func(t *testing.T) *AuthRequest { return capRequest(t, b.build(t)) }
	}
	withReq := func(b capBuild, change func(r *AuthRequest)) func(t *testing.T) *AuthRequest {
		return func(t *testing.T) *AuthRequest {
			r := capRequest(t, b.build(t))
			change(r)
			return r
		}
	}
	// resign re-signs r's envelope fields by the chain's holder.
	resign := func(r *AuthRequest) {
		ds, _ := r.Chain.(map[string]any)["delegations"].([]any)
		capSignSender(t, r, capKey(t, len(ds)+1))
	}
	revokedSet := func(targets ...string) func(string) bool {
		return func(s string) bool { return slices.Contains(targets, s) }
	}
	readOnlyRoot := capBuild{depth: 1, root: func(c *schemas.Capability) { c.Constraints = &schemas.Constraints{ReadOnly: true} }}

	for _, tc := range []struct {
		name   string
		req    func(t *testing.T) *AuthRequest
		codes  []string
		detail string
	}{
		{"valid", reqOf(capBuild{depth: 2}), nil, ""},
		{"valid read_only chain on a read tool", reqOf(readOnlyRoot), nil, ""},
		// SIGNATURE_INVALID
		{"root field changed after signing", withReq(capBuild{}, func(r *AuthRequest) {
			r.Chain.(map[string]any)["capability"].(map[string]any)["subject"] = "agent-x"
			r.AgentID = "agent-x"
		}), []string{sigInvalid}, "link 0: issuer signature does not verify"},
		{"delegation field changed after signing", withReq(capBuild{depth: 2}, func(r *AuthRequest) {
			d := r.Chain.(map[string]any)["delegations"].([]any)[1].(map[string]any)
			d["expires_at"] = capNow.Add(time.Minute).Format(schemas.TimeFormat)
			r.ChainHash = ""
			resign(r)
		}), []string{sigInvalid}, "link 2: delegator signature does not verify"},
		{"signature text with other trailing bits", withReq(capBuild{}, func(r *AuthRequest) {
			s := r.Chain.(map[string]any)["capability"].(map[string]any)["signature"].(map[string]any)
			s["sig"] = otherTrailingBits(t, s["sig"].(string))
			r.ChainHash = ""
			resign(r)
		}), []string{sigInvalid}, "link 0: signature is malformed"},
		{"sender_signature missing", withReq(capBuild{}, func(r *AuthRequest) { r.SenderSignature = nil }),
			[]string{sigInvalid}, "sender_signature: missing"},
		{"sender_signature with an extra member", withReq(capBuild{}, func(r *AuthRequest) {
			r.SenderSignature.(map[string]any)["x"] = "y"
		}), []string{sigInvalid}, "sender_signature: malformed"},
		{"sender_signature alg", withReq(capBuild{}, func(r *AuthRequest) {
			r.SenderSignature.(map[string]any)["alg"] = "RS256"
		}), []string{sigInvalid}, "sender_signature: malformed"},
		{"sender_signature a string", withReq(capBuild{}, func(r *AuthRequest) { r.SenderSignature = "sig" }),
			[]string{sigInvalid}, "sender_signature: malformed"},
		{"sender_signature by the issuer", withReq(capBuild{depth: 1}, func(r *AuthRequest) { capSignSender(t, r, capKey(t, 0)) }),
			[]string{sigInvalid}, "sender_signature: not by the capability holder's key"},
		{"sender_signature by the delegator, not the holder", withReq(capBuild{depth: 1}, func(r *AuthRequest) { capSignSender(t, r, capKey(t, 1)) }),
			[]string{sigInvalid}, "sender_signature: not by the capability holder's key"},
		{"actor is not the holder", withReq(capBuild{depth: 1}, func(r *AuthRequest) { r.AgentID = capAgent(0) }),
			[]string{sigInvalid}, "actor.agent_id is not the capability holder"},
		{"capability_hash of another chain", withReq(capBuild{}, func(r *AuthRequest) {
			r.ChainHash = strings.Repeat("0", 64)
		}), []string{sigInvalid}, "capability_hash: differs"},
		{"not an object", withReq(capBuild{}, func(r *AuthRequest) { r.Chain = []any{"x"} }),
			[]string{sigInvalid}, "capability: not a capability chain object"},
		{"unknown member", withReq(capBuild{}, func(r *AuthRequest) {
			r.Chain.(map[string]any)["capability"].(map[string]any)["admin"] = true
		}), []string{sigInvalid}, "/capability/capability: additionalProperties"},
		{"duplicate keys in raw JSON", withReq(capBuild{}, func(r *AuthRequest) {
			b, _ := json.Marshal(r.Chain)
			r.Chain = json.RawMessage(`{"capability":{},` + string(b[1:]))
		}), []string{sigInvalid}, "capability: not canonicalizable JSON"},
		// EXPIRED
		{"leaf expired", reqOf(capBuild{depth: 2, deleg: func(l int, d *schemas.Delegation) {
			if l == 2 {
				d.ExpiresAt = capNow.Add(-2 * time.Minute).Format(schemas.TimeFormat)
			}
		}}), []string{expired}, "link 2: expired"},
		{"root expired (delegations outlive nothing)", reqOf(capBuild{depth: 1, root: func(c *schemas.Capability) {
			c.ExpiresAt = capNow.Add(-2 * time.Minute).Format(schemas.TimeFormat)
		}, deleg: func(l int, d *schemas.Delegation) {
			d.ExpiresAt = capNow.Add(-3 * time.Minute).Format(schemas.TimeFormat)
		}}),
			[]string{expired}, "link 0: expired"},
		{"never valid", reqOf(capBuild{root: func(c *schemas.Capability) { c.ExpiresAt = c.IssuedAt }}),
			[]string{expired}, "link 0: expires_at is not after issued_at"},
		// REVOKED: revocation overrides an otherwise valid chain.
		{"root capability revoked", withReq(capBuild{depth: 2}, func(r *AuthRequest) { r.Revoked = revokedSet("cap-root") }),
			[]string{revoked}, "link 0: capability_id is revoked"},
		{"ancestor delegation revoked", withReq(capBuild{depth: 3}, func(r *AuthRequest) { r.Revoked = revokedSet("cap-d1") }),
			[]string{revoked}, "link 1: capability_id is revoked"},
		{"holder agent revoked", withReq(capBuild{depth: 2}, func(r *AuthRequest) { r.Revoked = revokedSet("agent:agent-2") }),
			[]string{revoked}, "link 2: an agent of this link is revoked"},
		{"root subject revoked", withReq(capBuild{depth: 2}, func(r *AuthRequest) { r.Revoked = revokedSet("agent:agent-0") }),
			[]string{revoked}, "link 0: an agent of this link is revoked"},
		{"revocation of another id", withReq(capBuild{depth: 2}, func(r *AuthRequest) { r.Revoked = revokedSet("cap-other", "agent:nobody") }),
			nil, ""},
		// DELEGATION_INVALID (more in Test_delegation_scope_widening_fails)
		{"malformed child scope", reqOf(capBuild{depth: 1, deleg: func(l int, d *schemas.Delegation) {
			d.ChildScope = []string{"tool:files:read_file", "tool:files"}
		}}), []string{delegInv}, "link 1: child_scope[1] is not contained"},
		// SCOPE_MISMATCH
		{"other tool", withReq(capBuild{depth: 1}, func(r *AuthRequest) { r.ToolName = "delete_file"; resign(r) }),
			[]string{scopeMis}, "capability: no scope of link 1 covers this call"},
		{"resource outside the leaf scope", withReq(capBuild{depth: 3}, func(r *AuthRequest) { r.Resource = "/work/docs/a"; resign(r) }),
			[]string{scopeMis}, "capability: no scope of link 3 covers this call"},
		{"no resource for a resource scope", withReq(capBuild{depth: 2}, func(r *AuthRequest) { r.HasResource, r.Resource = false, "" }),
			[]string{scopeMis}, ""},
		{"malformed root scope", reqOf(capBuild{root: func(c *schemas.Capability) { c.Scopes = []string{"tool:files"} }}),
			[]string{scopeMis}, "/capability/capability/scopes/0: pattern"},
		// TOOL_CLASS_MISMATCH
		{"read_only chain, write tool", withReq(readOnlyRoot, func(r *AuthRequest) {
			r.ToolName, r.Class = "write_file", schemas.ClassWrite
			resign(r)
		}), []string{classMis}, "read_only forbids a write tool"},
		// Several at once: every code, once, in order.
		{"expired, revoked, out of scope, wrong actor", withReq(capBuild{depth: 1}, func(r *AuthRequest) {
			r.Now = capNow.Add(3 * time.Hour)
			r.Revoked = revokedSet("cap-d1")
			r.ToolName = "delete_file"
			r.AgentID = "someone"
			resign(r)
		}), []string{sigInvalid, expired, revoked, scopeMis}, "link 1: expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := a.Authorize(tc.req(t))
			capWantCodes(t, res, tc.codes...)
			if tc.detail != "" {
				capHasDetail(t, res, tc.detail)
			}
		})
	}
}

// otherTrailingBits returns s (base64url of 64 bytes) with its last
// character's unused low bits changed: the same bytes to a lenient decoder.
func otherTrailingBits(t *testing.T, s string) string {
	out := otherTrailingBitsF(s)
	a, err1 := base64.RawURLEncoding.DecodeString(s)
	b, err2 := base64.RawURLEncoding.DecodeString(out)
	if err1 != nil || err2 != nil || string(a) != string(b) {
		t.Fatalf("trailing bits: %v %v", err1, err2)
	}
	return out
}

func TestAuthorizeNoIssuers(t *testing.T) {
	a, err := NewAuthorizer(CapabilityConfig{})
	if err != nil {
		t.Fatal(err)
	}
	res := a.Authorize(capRequest(t, capChain(t, 1)))
	capWantCodes(t, res, schemas.CodeSignatureInvalid)
	capHasDetail(t, res, "link 0: signed by an untrusted issuer key")
}

func TestNewAuthorizerConfig(t *testing.T) {
	pub := capKey(t, 0).Public()
	for name, cfg := range map[string]CapabilityConfig{
		"kid mismatch": {Issuers: verify.KeySet{"0000000000000000": pub}},
		"short key":    {Issuers: verify.KeySet{"x": pub[:10]}},
		"skew":         {Skew: -time.Second},
		"cache":        {VerifyCache: -1},
	} {
		if _, err := NewAuthorizer(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A smaller skew is honoured.
	ks := verify.KeySet{}
	ks.Add(pub)
	a, err := NewAuthorizer(CapabilityConfig{Issuers: ks, Skew: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	chain := capChain(t, 0)
	exp, _ := time.Parse(time.RFC3339, chain.Capability.ExpiresAt)
	r := capRequest(t, chain)
	r.Now = exp.Add(4 * time.Second)
	capWantCodes(t, a.Authorize(r))
	r.Now = exp.Add(6 * time.Second)
	capWantCodes(t, a.Authorize(r), schemas.CodeExpired)
	// The issuer set is copied: changing the caller's map later changes nothing.
	delete(ks, verify.KeyID(pub))
	r.Now = capNow
	capWantCodes(t, a.Authorize(r))
}

// TestVerifyCacheNeverMasks: verified signatures are cached, but a cached
// chain is still checked for expiry, revocation, scope and sender; and a
// changed signature is a different object, never a cache hit.
func TestVerifyCacheNeverMasks(t *testing.T) {
	a := capAuthorizer(t)
	chain := capChain(t, 3)
	r := capRequest(t, chain)
	capWantCodes(t, a.Authorize(r))
	if n := a.verified.Len(); n != 5 {
		t.Fatalf("cache holds %d entries, want 5 (4 links and the chain's schema check)", n)
	}
	capWantCodes(t, a.Authorize(r))
	if n := a.verified.Len(); n != 5 {
		t.Fatalf("second call added entries: %d", n)
	}
	rr := *r
	rr.Now = capNow.Add(2 * time.Hour)
	capWantCodes(t, a.Authorize(&rr), schemas.CodeExpired)
	rr = *r
	rr.Revoked = func(s string) bool { return s == "cap-d2" }
	capWantCodes(t, a.Authorize(&rr), schemas.CodeRevoked)
	rr = *r
	rr.SessionID = "other"
	capWantCodes(t, a.Authorize(&rr), schemas.CodeSignatureInvalid)
	bad := capChain(t, 3)
	bad.Delegations[2].Signature.Sig = otherTrailingBits(t, bad.Delegations[2].Signature.Sig)
	capWantCodes(t, a.Authorize(capRequest(t, bad)), schemas.CodeSignatureInvalid)
	// Failures are not cached: a chain that fails the schema fails again.
	n := a.verified.Len()
	for range 2 {
		bad := capChain(t, 3)
		bad.Capability.Scopes = []string{"tool:files"}
		capWantCodes(t, a.Authorize(capRequest(t, bad)), schemas.CodeSignatureInvalid, schemas.CodeDelegationInvalid, schemas.CodeScopeMismatch)
	}
	if a.verified.Len() != n {
		t.Fatalf("a failed check was cached: %d entries, had %d", a.verified.Len(), n)
	}
	// A cache of one entry still verifies every link.
	small, err := NewAuthorizer(CapabilityConfig{Issuers: a.issuers, VerifyCache: 1})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		capWantCodes(t, small.Authorize(r))
	}
}

// TestChainInputForms: the tree, raw JSON and the struct give one result.
func TestChainInputForms(t *testing.T) {
	a := capAuthorizer(t)
	chain := capChain(t, 2)
	r := capRequest(t, chain)
	raw, _ := json.Marshal(chain)
	indented, _ := json.MarshalIndent(chain, "", "  ")
	for name, v := range map[string]any{"tree": r.Chain, "raw": json.RawMessage(raw), "bytes": indented, "struct": *chain, "pointer": chain} {
		rr := *r
		rr.Chain = v
		res := a.Authorize(&rr)
		capWantCodes(t, res)
		if res.Holder != "agent-2" || len(res.CapabilityIDs) != 3 {
			t.Errorf("%s: %+v", name, res)
		}
	}
	var nilChain *schemas.CapabilityChain
	rr := *r
	rr.Chain = nilChain
	capWantCodes(t, a.Authorize(&rr), schemas.CodeSignatureInvalid)
}

func TestChainHashIsTreeHash(t *testing.T) {
	chain := capChain(t, 3)
	h, err := ChainHash(chain)
	if err != nil {
		t.Fatal(err)
	}
	b, err := jsonkit.CanonicalTree(capTree(t, chain))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if h != hex.EncodeToString(sum[:]) {
		t.Fatalf("ChainHash %s differs from the tree's hash", h)
	}
	// The object hash covers the signature.
	h1, _ := CapabilityObjectHash(chain.Capability)
	c := chain.Capability
	c.Signature = &schemas.Signature{Alg: c.Signature.Alg, KID: c.Signature.KID, Sig: flipB64(c.Signature.Sig, 3)}
	h2, _ := CapabilityObjectHash(&c)
	h3, _ := CapabilityObjectHash(capTree(t, chain.Capability))
	if h1 == h2 || h1 != h3 || h1 != chain.Delegations[0].ParentCapabilityHash {
		t.Fatalf("object hashes: %s %s %s", h1, h2, h3)
	}
	if _, err := CapabilityObjectHash("x"); err == nil {
		t.Fatal("hash of a string")
	}
	if _, err := ChainHash(nil); err == nil {
		t.Fatal("hash of no chain")
	}
}

func TestIssueCapability(t *testing.T) {
	issuer := capKey(t, 0)
	base := schemas.Capability{
		CapabilityID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", Issuer: "ops", Subject: "agent-0",
		SubjectPublicKey: PublicKeyString(capKey(t, 1).Public()), Scopes: []string{"tool:files:*"},
		IssuedAt: capNow.Format(schemas.TimeFormat), ExpiresAt: capNow.Add(time.Hour).Format(schemas.TimeFormat),
	}
	c, err := IssueCapability(issuer, base)
	if err != nil {
		t.Fatal(err)
	}
	if c.Type != schemas.CapabilityTypeV1 || c.Signature == nil || c.Signature.KID != issuer.KID {
		t.Fatalf("issued %+v", c)
	}
	chain := &schemas.CapabilityChain{Capability: c}
	r := capRequest(t, chain)
	r.Resource = "/anything"
	capSignSender(t, r, capKey(t, 1))
	capWantCodes(t, capAuthorizer(t).Authorize(r))

	for name, mutate := range map[string]func(c *schemas.Capability){
		"no scopes":       func(c *schemas.Capability) { c.Scopes = nil },
		"bad scope":       func(c *schemas.Capability) { c.Scopes = []string{"files:*"} },
		"duplicate scope": func(c *schemas.Capability) { c.Scopes = []string{"tool:files:*", "tool:files:*"} },
		"bad time":        func(c *schemas.Capability) { c.IssuedAt = "yesterday" },
		"expires first":   func(c *schemas.Capability) { c.ExpiresAt = capNow.Add(-time.Hour).Format(schemas.TimeFormat) },
		"bad subject key": func(c *schemas.Capability) { c.SubjectPublicKey = "abc" },
		"id with colon":   func(c *schemas.Capability) { c.CapabilityID = "agent:x" },
		"no subject":      func(c *schemas.Capability) { c.Subject = "" },
	} {
		c := base
		mutate(&c)
		if _, err := IssueCapability(issuer, c); err == nil {
			t.Errorf("%s: issued", name)
		}
	}
	if _, err := IssueCapability(nil, base); err == nil {
		t.Error("issued without a key")
	}
}

// TestDelegateMatchesVerifier: Delegate's output verifies, fills the
// delegator, and equals the fixture's independently signed delegation.
func TestDelegateMatchesVerifier(t *testing.T) {
	fixture := capChain(t, 2)
	chain := &schemas.CapabilityChain{Capability: fixture.Capability}
	var parent any = &chain.Capability
	for i, want := range fixture.Delegations {
		d := want
		d.Signature, d.ParentCapabilityHash, d.DelegatorID, d.Type = nil, "", "", ""
		got, err := Delegate(capKey(t, i+1), parent, d)
		if err != nil {
			t.Fatal(err)
		}
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		if string(gb) != string(wb) {
			t.Fatalf("link %d:\n got %s\nwant %s", i+1, gb, wb)
		}
		chain.Delegations = append(chain.Delegations, got)
		parent = got
	}
	capWantCodes(t, capAuthorizer(t).Authorize(capRequest(t, chain)))

	d := fixture.Delegations[0]
	d.Signature = nil
	if _, err := Delegate(capKey(t, 5), fixture.Capability, d); err == nil || !strings.Contains(err.Error(), "not the parent's holder key") {
		t.Fatalf("delegated with a key that is not the holder's: %v", err)
	}
	d.DelegatorID = "agent-9"
	if _, err := Delegate(capKey(t, 1), fixture.Capability, d); err == nil {
		t.Fatal("delegated with another delegator_id")
	}
	if _, err := Delegate(capKey(t, 1), "x", d); err == nil {
		t.Fatal("delegated from a string")
	}
}

func TestPublicKeyString(t *testing.T) {
	pub := capKey(t, 3).Public()
	s := PublicKeyString(pub)
	got, err := ParsePublicKeyString(s)
	if err != nil || !got.Equal(pub) {
		t.Fatalf("round trip: %v", err)
	}
	for _, bad := range []string{"", "abc", s + "A", s + "=", otherTrailingBits(t, s)} {
		if _, err := ParsePublicKeyString(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestVerifyChain(t *testing.T) {
	a := capAuthorizer(t)
	chain := capChain(t, 2)
	res := a.VerifyChain(capTree(t, chain), capNow, nil)
	capWantCodes(t, res)
	if res.Holder != "agent-2" {
		t.Fatalf("holder %q", res.Holder)
	}
	// No sender signature, actor, class or scope check without a call.
	res = a.VerifyChain(capTree(t, chain), capNow.Add(3*time.Hour), func(s string) bool { return s == "agent:agent-1" })
	capWantCodes(t, res, schemas.CodeExpired, schemas.CodeRevoked)
}
