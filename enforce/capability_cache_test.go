package enforce

import (
	"crypto/sha256"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// capReference is what Authorize returns for r with nothing remembered and
// the sender signature verified in place: the result every other way of
// asking must equal.
func capReference(t testing.TB, r *AuthRequest) AuthResult {
	t.Helper()
	rr := *r
	rr.ChainRaw, rr.DeferSender = nil, false
	return capAuthorizer(t).Authorize(&rr)
}

// capSameResult fails unless got equals want in every field.
func capSameResult(t testing.TB, what string, got, want AuthResult) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// capRawKey is the chain cache key of r's ChainRaw.
func capRawKey(r *AuthRequest) chainKey {
	return chainKey{raw: true, sum: sha256.Sum256(r.ChainRaw)}
}

// TestChainCacheStillDenies: once a chain's bytes are cached, the checks
// that depend on the call or the clock still run on every call: a cached
// chain is denied when it expires, is not valid yet, is revoked, does not
// cover the call, is used by another actor or for a write tool while
// read_only, or arrives under another capability_hash. Each result equals
// the one computed from scratch, and none of them re-verifies the chain.
func TestChainCacheStillDenies(t *testing.T) {
	readOnly := capBuild{depth: 2, root: func(c *schemas.Capability) { c.Constraints = &schemas.Constraints{ReadOnly: true} }}
	revokedSet := func(targets ...string) func(string) bool {
		return func(s string) bool { return slices.Contains(targets, s) }
	}
	for _, tc := range []struct {
		name   string
		build  capBuild
		change func(t *testing.T, r *AuthRequest)
		codes  []string
		detail string
	}{
		{"unchanged", capBuild{depth: 3}, func(*testing.T, *AuthRequest) {}, nil, ""},
		{"expired", capBuild{depth: 3}, func(_ *testing.T, r *AuthRequest) { r.Now = capNow.Add(2 * time.Hour) },
			[]string{schemas.CodeExpired}, "link 0: expired"},
		{"leaf expired, root valid", capBuild{depth: 3}, func(_ *testing.T, r *AuthRequest) {
			r.Now = capNow.Add(time.Hour - 3*time.Minute + DefaultCapabilitySkew + time.Second)
		}, []string{schemas.CodeExpired}, "link 3: expired"},
		{"not valid yet", capBuild{depth: 3}, func(_ *testing.T, r *AuthRequest) { r.Now = capNow.Add(-2 * time.Hour) },
			[]string{schemas.CodeExpired}, "link 0: not valid yet"},
		{"delegation revoked", capBuild{depth: 3}, func(_ *testing.T, r *AuthRequest) { r.Revoked = revokedSet("cap-d2") },
			[]string{schemas.CodeRevoked}, "link 2: capability_id is revoked"},
		{"holder revoked", capBuild{depth: 3}, func(_ *testing.T, r *AuthRequest) { r.Revoked = revokedSet("agent:agent-3") },
			[]string{schemas.CodeRevoked}, "link 3: an agent of this link is revoked"},
		{"other tool", capBuild{depth: 3}, func(t *testing.T, r *AuthRequest) {
			r.ToolName = "write_file"
			capSignSender(t, r, capKey(t, 4))
		}, []string{schemas.CodeScopeMismatch}, "capability: no scope of link 3 covers this call"},
		{"resource outside the scope", capBuild{depth: 3}, func(t *testing.T, r *AuthRequest) {
			r.Resource = "/work/docs/a"
		}, []string{schemas.CodeScopeMismatch}, "capability: no scope of link 3 covers this call"},
		{"other actor", capBuild{depth: 3}, func(_ *testing.T, r *AuthRequest) { r.AgentID = capAgent(1) },
			[]string{schemas.CodeSignatureInvalid}, "actor.agent_id is not the capability holder"},
		{"read_only chain, write tool", readOnly, func(_ *testing.T, r *AuthRequest) { r.Class = schemas.ClassWrite },
			[]string{schemas.CodeToolClassMismatch}, "read_only forbids a write tool"},
		{"same bytes, other capability_hash", capBuild{depth: 3}, func(t *testing.T, r *AuthRequest) {
			r.ChainHash = strings.Repeat("0", 64)
			capSignSender(t, r, capKey(t, 4)) // a sender signature over that hash
		}, []string{schemas.CodeSignatureInvalid}, "capability_hash: differs"},
		{"sender signed other fields", capBuild{depth: 3}, func(_ *testing.T, r *AuthRequest) { r.SessionID = "session-2" },
			[]string{schemas.CodeSignatureInvalid}, "sender_signature: does not match"},
		{"sender signature by another key", capBuild{depth: 3}, func(t *testing.T, r *AuthRequest) { capSignSender(t, r, capKey(t, 3)) },
			[]string{schemas.CodeSignatureInvalid}, "sender_signature: not by the capability holder's key"},
		{"several at once", capBuild{depth: 3}, func(t *testing.T, r *AuthRequest) {
			r.Now = capNow.Add(2 * time.Hour)
			r.Revoked = revokedSet("cap-root", "agent:agent-1")
			r.AgentID = "someone"
			r.SessionID = "session-2"
		}, []string{schemas.CodeSignatureInvalid, schemas.CodeExpired, schemas.CodeRevoked}, "link 1: an agent of this link is revoked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := capAuthorizer(t)
			primer := capRawRequest(t, tc.build.build(t))
			capWantCodes(t, a.Authorize(primer))
			if !a.chains.Contains(capRawKey(primer)) {
				t.Fatal("a verified chain was not cached under its bytes")
			}
			a.verified.Purge() // anything that re-verifies the chain refills it

			r := *primer
			tc.change(t, &r)
			got := a.Authorize(&r)
			capWantCodes(t, got, tc.codes...)
			if tc.detail != "" {
				capHasDetail(t, got, tc.detail)
			}
			capSameResult(t, "cached", got, capReference(t, &r))
			if n := a.verified.Len(); n != 0 {
				t.Fatalf("the cached chain was verified again (%d entries)", n)
			}
		})
	}
}

// TestChainCacheOnlySuccesses: a chain with a finding of its own (a bad
// signature, a schema violation, a widening delegation) is never cached,
// so it is verified, and denied, on every call.
func TestChainCacheOnlySuccesses(t *testing.T) {
	badSig := capChain(t, 2)
	badSig.Delegations[1].Signature.Sig = flipB64(badSig.Delegations[1].Signature.Sig, 5)
	badSchema := capChain(t, 1)
	badSchema.Capability.Scopes = []string{"tool:files"}
	widening := capBuild{depth: 1, deleg: func(_ int, d *schemas.Delegation) { d.ChildScope = []string{"tool:mail:*"} }}.build(t)
	badHolderKey := capBuild{depth: 1, deleg: func(_ int, d *schemas.Delegation) { d.DelegateePublicKey = "AAAA" }}.build(t)
	for name, chain := range map[string]*schemas.CapabilityChain{
		"bad signature": badSig, "schema": badSchema, "widening": widening, "bad holder key": badHolderKey,
	} {
		t.Run(name, func(t *testing.T) {
			a := capAuthorizer(t)
			r := capRawRequest(t, chain)
			want := capReference(t, r)
			if want.OK() {
				t.Fatal("the fixture authorizes")
			}
			for range 3 {
				capSameResult(t, "uncached", a.Authorize(r), want)
			}
			if n := a.chains.Len(); n != 0 {
				t.Fatalf("a chain with findings was cached (%d entries)", n)
			}
		})
	}
}

// TestChainRawMismatch: bytes that are not Chain's encoding are never
// cached as naming it, so they cannot later stand for a chain they do
// not hold.
func TestChainRawMismatch(t *testing.T) {
	a := capAuthorizer(t)
	r := capRawRequest(t, capChain(t, 2))
	other, err := json.Marshal(capChain(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	r.ChainRaw = other
	capSameResult(t, "mismatched raw", a.Authorize(r), capReference(t, r))
	if a.chains.Contains(capRawKey(r)) {
		t.Fatal("bytes of another chain were cached as naming this one")
	}
	// Other bytes with the same canonical form name the chain too.
	r = capRawRequest(t, capChain(t, 2))
	indented, err := json.MarshalIndent(r.Chain, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	r.ChainRaw = indented
	capSameResult(t, "indented raw", a.Authorize(r), capReference(t, r))
	if !a.chains.Contains(capRawKey(r)) {
		t.Fatal("bytes canonically equal to the chain were not cached")
	}
}

// TestChainCacheInputForms: every accepted Chain form, with and without
// ChainRaw, cold and cached, gives the reference result.
func TestChainCacheInputForms(t *testing.T) {
	a := capAuthorizer(t)
	chain := capChain(t, 3)
	r := capRawRequest(t, chain)
	want := capReference(t, r)
	capWantCodes(t, want)
	for name, v := range map[string]any{"tree": r.Chain, "raw": json.RawMessage(r.ChainRaw), "bytes": r.ChainRaw, "struct": *chain, "pointer": chain} {
		for _, raw := range [][]byte{nil, r.ChainRaw} {
			rr := *r
			rr.Chain, rr.ChainRaw = v, raw
			for range 2 {
				capSameResult(t, name, a.Authorize(&rr), want)
			}
		}
	}
	// ChainRaw without a Chain is no capability.
	rr := *r
	rr.Chain = nil
	capSameResult(t, "no chain", a.Authorize(&rr), capReference(t, &rr))
	capWantCodes(t, a.Authorize(&rr), schemas.CodeNoCapability)
}

// TestChainCacheBounded: the chain cache keeps at most ChainCache entries
// and still verifies every chain when they do not fit.
func TestChainCacheBounded(t *testing.T) {
	ks := verify.KeySet{}
	ks.Add(capKey(t, 0).Public())
	a, err := NewAuthorizer(CapabilityConfig{Issuers: ks, ChainCache: 2})
	if err != nil {
		t.Fatal(err)
	}
	var reqs []*AuthRequest
	for depth := range 4 {
		reqs = append(reqs, capRawRequest(t, capChain(t, depth)))
	}
	for range 2 {
		for _, r := range reqs {
			capSameResult(t, "bounded", a.Authorize(r), capReference(t, r))
		}
	}
	if n := a.chains.Len(); n > 2 {
		t.Fatalf("chain cache holds %d entries, bound 2", n)
	}
	if _, err := NewAuthorizer(CapabilityConfig{ChainCache: -1}); err == nil {
		t.Fatal("a negative chain cache size was accepted")
	}
}

// TestAuthorizeDeferSender: with DeferSender, Authorize leaves exactly the
// final Ed25519 verification to the caller, and SenderVerified turns the
// result into the immediate one, codes, details and order included.
func TestAuthorizeDeferSender(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(t *testing.T, r *AuthRequest)
		pending bool // a signature is left to verify
	}{
		{"valid", func(*testing.T, *AuthRequest) {}, true},
		{"signed other fields", func(_ *testing.T, r *AuthRequest) { r.SessionID = "session-2" }, true},
		{"expired and signed other fields", func(_ *testing.T, r *AuthRequest) {
			r.Now = capNow.Add(2 * time.Hour)
			r.SessionID = "session-2"
		}, true},
		{"wrong actor and signed other fields", func(_ *testing.T, r *AuthRequest) {
			r.AgentID = "someone"
			r.SessionID = "session-2"
		}, true},
		{"out of scope, signed", func(t *testing.T, r *AuthRequest) {
			r.ToolName = "write_file"
			capSignSender(t, r, capKey(t, 3))
		}, true},
		{"missing", func(_ *testing.T, r *AuthRequest) { r.SenderSignature = nil }, false},
		{"malformed", func(_ *testing.T, r *AuthRequest) { r.SenderSignature = map[string]any{"alg": "Ed25519"} }, false},
		{"by another key", func(t *testing.T, r *AuthRequest) { capSignSender(t, r, capKey(t, 1)) }, false},
		{"chain does not decode", func(_ *testing.T, r *AuthRequest) { r.Chain, r.ChainRaw = []any{"x"}, nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := capAuthorizer(t)
			r := capRawRequest(t, capChain(t, 2))
			tc.change(t, r)
			want := capReference(t, r)
			r.DeferSender = true
			for _, cached := range []string{"cold", "cached"} {
				got := a.Authorize(r)
				if (got.Sender != nil) != tc.pending {
					t.Fatalf("%s: Sender %v, want pending %v", cached, got.Sender, tc.pending)
				}
				if got.Sender != nil {
					if got.OK() {
						t.Fatalf("%s: OK with a sender signature left to verify", cached)
					}
					got.SenderVerified(verify.Verify(got.Sender.Pub, got.Sender.Message, got.Sender.Sig))
				}
				capSameResult(t, cached, got, want)
				got.SenderVerified(false) // nothing pending: no effect
				capSameResult(t, cached+", reported twice", got, want)
			}
		})
	}
}

// TestAuthorizeDeferSenderBatch: results verified together with
// verify.VerifyAll, from several goroutines sharing one Authorizer,
// equal the immediate ones.
func TestAuthorizeDeferSenderBatch(t *testing.T) {
	a := capAuthorizer(t)
	var reqs []*AuthRequest
	var wants []AuthResult
	for i := range 6 {
		r := capRawRequest(t, capChain(t, i%4))
		if i%3 == 1 {
			r.CorrelationID = "other-correlation-id-123" // no longer what was signed
		}
		wants = append(wants, capReference(t, r))
		r.DeferSender = true
		reqs = append(reqs, r)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 4 {
		wg.Go(func() {
			for range 5 {
				res := make([]AuthResult, len(reqs))
				checks := make([]verify.SigCheck, len(reqs))
				for i, r := range reqs {
					res[i] = a.Authorize(r)
					checks[i] = *res[i].Sender
				}
				for i, ok := range verify.VerifyAll(checks) {
					res[i].SenderVerified(ok)
					if !reflect.DeepEqual(res[i], wants[i]) {
						errs <- "batched result differs from the immediate one"
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if wants[1].OK() || !wants[0].OK() {
		t.Fatal("fixtures: want request 0 authorized and request 1 denied")
	}
}

// TestSenderVerifiedOrder: a failed sender verification takes
// SIGNATURE_INVALID's place among the codes and adds its detail last.
func TestSenderVerifiedOrder(t *testing.T) {
	pending := &verify.SigCheck{}
	r := AuthResult{Codes: []string{schemas.CodeExpired, schemas.CodeScopeMismatch}, Details: []string{"a", "b"}, Sender: pending}
	r.SenderVerified(false)
	if want := []string{schemas.CodeSignatureInvalid, schemas.CodeExpired, schemas.CodeScopeMismatch}; !slices.Equal(r.Codes, want) {
		t.Fatalf("codes %v, want %v", r.Codes, want)
	}
	if want := []string{"a", "b", detailSenderMismatch}; !slices.Equal(r.Details, want) {
		t.Fatalf("details %v, want %v", r.Details, want)
	}
	r = AuthResult{Codes: []string{schemas.CodeNoCapability, schemas.CodeSignatureInvalid}, Sender: pending}
	r.SenderVerified(false)
	if want := []string{schemas.CodeNoCapability, schemas.CodeSignatureInvalid}; !slices.Equal(r.Codes, want) || r.Sender != nil {
		t.Fatalf("codes %v, want %v once; sender %v", r.Codes, want, r.Sender)
	}
	r = AuthResult{Sender: pending}
	r.SenderVerified(true)
	if !r.OK() {
		t.Fatalf("a verified sender left %+v", r)
	}
}

// TestFindingsManyDetails: details stay unique and in order past the
// point where findings switches from scanning to a set.
func TestFindingsManyDetails(t *testing.T) {
	var f findings
	var want []string
	for i := range 3 * maxLinearDetails {
		d := strings.Repeat("x", i+1)
		f.add(schemas.CodeScopeMismatch, d)
		f.add(schemas.CodeScopeMismatch, d)
		if i > 0 {
			f.add(schemas.CodeScopeMismatch, strings.Repeat("x", i))
		}
		want = append(want, d)
	}
	f.add("NOT_A_CODE", "")
	res := f.result(nil)
	if !slices.Equal(res.Details, want) || !slices.Equal(res.Codes, []string{schemas.CodeScopeMismatch}) {
		t.Fatalf("codes %v, %d details", res.Codes, len(res.Details))
	}
}

// TestEnvelopeDigest: the directly written digest of the sender's signed
// fields is sha256(JCS(fields)), and every field is covered: a field
// added to EnvelopeSignedFields without being written fails here.
func TestEnvelopeDigest(t *testing.T) {
	base := schemas.EnvelopeSignedFields{
		Type: schemas.EnvelopeSignatureV1, CorrelationID: "c", CapabilityHash: "h", RequestHash: "r",
		Tool: "s:t", Method: schemas.MethodToolsCall, Timestamp: "2025-01-15T10:00:00.000Z", SessionID: "s",
	}
	want, err := canonicalSum(&base)
	if err != nil {
		t.Fatal(err)
	}
	if envelopeDigest(&base) != want {
		t.Fatal("digest differs from sha256(JCS(fields))")
	}
	v := reflect.ValueOf(&base).Elem()
	for i := range v.NumField() {
		f := base
		fv := reflect.ValueOf(&f).Elem().Field(i)
		if fv.Kind() != reflect.String {
			t.Fatalf("field %s is a %s; envelopeDigest writes strings only", v.Type().Field(i).Name, fv.Kind())
		}
		fv.SetString("changed \"\x01\xff\u2028")
		want, err := canonicalSum(&f)
		if err != nil {
			t.Fatal(err)
		}
		if got := envelopeDigest(&f); got != want || got == envelopeDigest(&base) {
			t.Fatalf("field %s: not covered as JCS covers it", v.Type().Field(i).Name)
		}
	}
}
