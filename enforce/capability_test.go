package enforce

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// The capability protocol's required tests (the test_… IDs of
// docs/REQUIREMENTS.md).

// Test_proxy_requires_capability: a call without a capability is denied
// NO_CAPABILITY, and nothing else is claimed about it; the same call with
// a valid chain is authorized.
func Test_proxy_requires_capability(t *testing.T) {
	a := capAuthorizer(t)
	r := capRequest(t, capChain(t, 0))
	capWantCodes(t, a.Authorize(r))
	r.Chain = nil
	res := a.Authorize(r)
	capWantCodes(t, res, schemas.CodeNoCapability)
	if res.Holder != "" || res.CapabilityIDs != nil {
		t.Fatalf("no chain, but holder %q ids %v", res.Holder, res.CapabilityIDs)
	}
	capWantCodes(t, a.Authorize(nil), schemas.CodeNoCapability)
	capWantCodes(t, a.VerifyChain(nil, capNow, nil), schemas.CodeNoCapability)
}

// Test_capability_mid_session_expiry: capabilities are checked per request,
// never per session: the same chain in the same session authorizes before
// expires_at + 60 s and is EXPIRED after it, with signature results cached.
func Test_capability_mid_session_expiry(t *testing.T) {
	a := capAuthorizer(t)
	chain := capChain(t, 2)
	expires, _ := time.Parse(time.RFC3339, chain.Delegations[1].ExpiresAt) // the shortest-lived link
	for _, tc := range []struct {
		at    time.Time
		codes []string
	}{
		{capNow, nil},
		{expires, nil},
		{expires.Add(59 * time.Second), nil}, // within the 60 s skew
		{expires.Add(61 * time.Second), []string{schemas.CodeExpired}},
		{expires.Add(24 * time.Hour), []string{schemas.CodeExpired}},
	} {
		r := capRequest(t, chain) // same session, same chain, a new request
		r.Now = tc.at
		res := a.Authorize(r)
		capWantCodes(t, res, tc.codes...)
		if tc.codes != nil {
			capHasDetail(t, res, "link 2: expired")
		}
	}
	// The chain's links are each within their own windows: only link 2
	// (expiring first) is named at a time between link 2's and link 1's end.
	r := capRequest(t, chain)
	r.Now = expires.Add(61 * time.Second)
	res := a.Authorize(r)
	for _, d := range res.Details {
		if strings.Contains(d, "link 0") || strings.Contains(d, "link 1") {
			t.Fatalf("unexpected detail %q", d)
		}
	}
	// Not yet valid: issued_at beyond the skew in the future.
	r = capRequest(t, chain)
	r.Now = capNow.Add(-time.Hour - 61*time.Second)
	res = a.Authorize(r)
	capWantCodes(t, res, schemas.CodeExpired)
	capHasDetail(t, res, "link 0: not valid yet")
}

// Test_delegation_chain_verification: chains of 0..3 delegations verify,
// name their holder and ids; every link's signature and linkage is
// checked; a fourth delegation is DELEGATION_INVALID.
func Test_delegation_chain_verification(t *testing.T) {
	a := capAuthorizer(t)
	for depth := 0; depth <= schemas.MaxDelegationDepth; depth++ {
		res := a.Authorize(capRequest(t, capChain(t, depth)))
		capWantCodes(t, res)
		if res.Holder != capAgent(depth) {
			t.Fatalf("depth %d: holder %q", depth, res.Holder)
		}
		wantIDs := []string{"cap-root", "cap-d1", "cap-d2", "cap-d3"}[:depth+1]
		if !slices.Equal(res.CapabilityIDs, wantIDs) {
			t.Fatalf("depth %d: ids %v", depth, res.CapabilityIDs)
		}
	}
	// Depth 4: properly signed and narrowing, but too deep.
	res := a.Authorize(capRequest(t, capChain(t, 4)))
	capWantCodes(t, res, schemas.CodeDelegationInvalid)
	capHasDetail(t, res, "/capability/delegations: maxItems")
	capHasDetail(t, res, "capability: 4 delegations, more than 3")
	if res.Holder != capAgent(4) || len(res.CapabilityIDs) != 5 {
		t.Fatalf("depth 4 still decodes: holder %q ids %v", res.Holder, res.CapabilityIDs)
	}

	cases := []struct {
		name   string
		b      capBuild
		code   string
		detail string
	}{
		{"delegation signed by the issuer, not the parent holder", capBuild{depth: 2, signer: func(l int) *receipts.PrivateKey {
			if l == 2 {
				return capKey(t, 0)
			}
			return nil
		}}, schemas.CodeSignatureInvalid, "link 2: not signed by the parent's holder key"},
		{"delegation signed by its own delegatee", capBuild{depth: 1, signer: func(l int) *receipts.PrivateKey {
			if l == 1 {
				return capKey(t, 2)
			}
			return nil
		}}, schemas.CodeSignatureInvalid, "link 1: not signed by the parent's holder key"},
		{"root signed by an untrusted key", capBuild{depth: 1, signer: func(l int) *receipts.PrivateKey {
			if l == 0 {
				return capKey(t, 9)
			}
			return nil
		}}, schemas.CodeSignatureInvalid, "link 0: signed by an untrusted issuer key"},
		{"parent hash of another object", capBuild{depth: 2, deleg: func(l int, d *schemas.Delegation) {
			if l == 2 {
				d.ParentCapabilityHash = strings.Repeat("0", 64)
			}
		}}, schemas.CodeDelegationInvalid, "link 2: parent_capability_hash is not the hash of link 1"},
		{"delegator is not the parent holder", capBuild{depth: 2, deleg: func(l int, d *schemas.Delegation) {
			if l == 2 {
				d.DelegatorID = capAgent(0)
			}
		}}, schemas.CodeDelegationInvalid, "link 2: delegator_id is not the holder of link 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := a.Authorize(capRequest(t, tc.b.build(t)))
			if !slices.Contains(res.Codes, tc.code) {
				t.Fatalf("codes %v, want %s; %v", res.Codes, tc.code, res.Details)
			}
			capHasDetail(t, res, tc.detail)
		})
	}

	// Links spliced from another valid chain (same shape, other root):
	// the hash linkage breaks.
	other := capBuild{depth: 2, root: func(c *schemas.Capability) { c.CapabilityID = "cap-other" }}.build(t)
	chain := capChain(t, 2)
	chain.Delegations[0] = other.Delegations[0]
	res = a.Authorize(capRequest(t, chain))
	capWantCodes(t, res, schemas.CodeDelegationInvalid)
	capHasDetail(t, res, "link 1: parent_capability_hash")

	// Any byte of any link's signature changed: SIGNATURE_INVALID.
	for link := 0; link <= 3; link++ {
		chain := capChain(t, 3)
		sig := &chain.Capability.Signature
		if link > 0 {
			sig = &chain.Delegations[link-1].Signature
		}
		s := **sig
		s.Sig = flipB64(s.Sig, 10)
		*sig = &s
		res := a.Authorize(capRequest(t, chain))
		if !slices.Contains(res.Codes, schemas.CodeSignatureInvalid) {
			t.Fatalf("link %d sig changed: %v", link, res.Codes)
		}
	}
}

// flipB64 changes the base64url character at i to another one.
func flipB64(s string, i int) string {
	b := []byte(s)
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// Test_replayed_request_rejected: a captured, validly signed envelope
// re-sent with another request, session, correlation id, tool or time
// fails its sender signature; re-sent unchanged, the replay guard denies
// its correlation_id the second time (REPLAY).
func Test_replayed_request_rejected(t *testing.T) {
	a := capAuthorizer(t)
	captured := capRequest(t, capChain(t, 1))
	capWantCodes(t, a.Authorize(captured))
	for _, tc := range []struct {
		name   string
		change func(r *AuthRequest)
	}{
		{"other arguments", func(r *AuthRequest) { r.RequestHash = strings.Repeat("cd", 32) }},
		{"other session", func(r *AuthRequest) { r.SessionID = "session-2" }},
		{"other correlation id", func(r *AuthRequest) { r.CorrelationID = "zzzzzzzzzzzzzzzzzzzzzz" }},
		{"other tool", func(r *AuthRequest) { r.ToolName = "write_file"; r.Class = schemas.ClassWrite }},
		{"other timestamp", func(r *AuthRequest) { r.IssuedAt = capNow.Add(time.Second).Format(schemas.TimeFormat) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := *captured
			tc.change(&r)
			res := a.Authorize(&r)
			capWantCodes(t, res, schemas.CodeSignatureInvalid)
			capHasDetail(t, res, "sender_signature: does not match the envelope's signed fields")
		})
	}
	// The unchanged envelope authorizes, but its correlation_id is used
	// once per session: a second tool call with it is a replay.
	ledger := NewMemLedger()
	claim := func(toolCallID string) *LedgerOp {
		op := &LedgerOp{Kind: OpClaimCall, Call: CallKey{SessionID: captured.SessionID, CorrelationID: captured.CorrelationID, ToolCallID: toolCallID}}
		ledger.Do([]*LedgerOp{op})
		return op
	}
	if op := claim("call-1"); op.Err != nil || !op.Won {
		t.Fatalf("first use: %+v", op)
	}
	capWantCodes(t, a.Authorize(captured))
	if op := claim("call-2"); op.Err != nil || op.Won || op.Held.ToolCallID != "call-1" {
		t.Fatalf("second use: %+v, want the pair held by call-1 (REPLAY)", op)
	}
}

// Test_delegation_scope_widening_fails: a delegation may only narrow.
// Delegate refuses to sign a widening; one signed anyway (rawSign) is
// DELEGATION_INVALID at the verifier.
func Test_delegation_scope_widening_fails(t *testing.T) {
	a := capAuthorizer(t)
	for _, tc := range []struct {
		name   string
		level  int
		mutate func(d *schemas.Delegation)
		detail string
	}{
		{"other server", 1, func(d *schemas.Delegation) { d.ChildScope = []string{"tool:mail:read_file"} }, "link 1: child_scope[0]"},
		{"every tool of every server", 1, func(d *schemas.Delegation) { d.ChildScope = []string{"tool:*"} }, "link 1: child_scope[0]"},
		{"every tool of the server", 2, func(d *schemas.Delegation) { d.ChildScope = []string{"tool:files:*"} }, "link 2: child_scope[0]"},
		{"drops the resource segment", 3, func(d *schemas.Delegation) { d.ChildScope = []string{"tool:files:read_file"} }, "link 3: child_scope[0]"},
		{"wider resource prefix", 3, func(d *schemas.Delegation) { d.ChildScope = []string{"tool:files:read_file/resource:/*"} }, "link 3: child_scope[0]"},
		{"sibling resource", 3, func(d *schemas.Delegation) { d.ChildScope = []string{"tool:files:read_file/resource:/etc/*"} }, "link 3: child_scope[0]"},
		{"one narrow, one wide", 2, func(d *schemas.Delegation) {
			d.ChildScope = []string{"tool:files:read_file/resource:/work/x", "tool:files:delete_file"}
		}, "link 2: child_scope[1]"},
		{"drops read_only", 2, func(d *schemas.Delegation) { d.Constraints = nil }, "link 2: drops the read_only constraint"},
		{"outlives its parent", 2, func(d *schemas.Delegation) {
			d.ExpiresAt = capNow.Add(2 * time.Hour).Format(schemas.TimeFormat)
		}, "link 2: expires_at is after that of link 1"},
		{"issued before its parent", 2, func(d *schemas.Delegation) {
			d.IssuedAt = capNow.Add(-2 * time.Hour).Format(schemas.TimeFormat)
		}, "link 2: issued_at is before that of link 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := capBuild{depth: 3, root: func(c *schemas.Capability) {
				c.Constraints = &schemas.Constraints{ReadOnly: true}
			}, deleg: func(l int, d *schemas.Delegation) {
				if l == tc.level {
					tc.mutate(d)
				}
			}}
			chain := b.build(t)
			res := a.Authorize(capRequest(t, chain))
			// Properly signed and current: only the delegation is wrong
			// (a widened leaf may also not cover the call).
			if !slices.Contains(res.Codes, schemas.CodeDelegationInvalid) || slices.Contains(res.Codes, schemas.CodeSignatureInvalid) ||
				slices.Contains(res.Codes, schemas.CodeExpired) {
				t.Fatalf("codes %v; %v", res.Codes, res.Details)
			}
			capHasDetail(t, res, tc.detail)

			// Delegate refuses to make the same delegation.
			holder := capKey(t, tc.level)
			var parent any = chain.Capability
			if tc.level > 1 {
				parent = chain.Delegations[tc.level-2]
			}
			d := chain.Delegations[tc.level-1]
			d.Signature, d.ParentCapabilityHash = nil, ""
			if _, err := Delegate(holder, parent, d); err == nil {
				t.Fatal("Delegate signed a widening delegation")
			}
		})
	}
}

// Test_signature_context_confusion: a signature made for one object type
// or field set never verifies as another, even by the right key.
func Test_signature_context_confusion(t *testing.T) {
	a := capAuthorizer(t)
	issuer := capKey(t, 0)

	// 1. The issuer signed a delegation-typed object with the capability's
	// very fields; the signature placed on the capability fails.
	chain := capChain(t, 0)
	asDeleg := chain.Capability
	asDeleg.Type = schemas.DelegationTypeV1
	chain.Capability.Signature = rawSign(t, issuer, &asDeleg)
	res := a.Authorize(capRequest(t, chain))
	capWantCodes(t, res, schemas.CodeSignatureInvalid)
	capHasDetail(t, res, "link 0: issuer signature does not verify")

	// 2. A root whose subject key is the issuer's: the root capability's
	// signature copied onto a delegation by the same key fails.
	self := capBuild{depth: 1, root: func(c *schemas.Capability) {
		c.SubjectPublicKey = PublicKeyString(issuer.Public())
	}, signer: func(l int) *receipts.PrivateKey { return issuer }}.build(t)
	capWantCodes(t, a.Authorize(capRequest(t, self)))
	self.Delegations[0].Signature = self.Capability.Signature
	res = a.Authorize(capRequest(t, self))
	capWantCodes(t, res, schemas.CodeSignatureInvalid)
	capHasDetail(t, res, "link 1: delegator signature does not verify")

	// 3. A sender signature (envelope type) is not a delegation signature,
	// and a delegation signature is not a sender signature, though made by
	// the right key. Link 2 is signed by agent-1 (key 2): an envelope
	// signature by agent-1 put on link 2 fails.
	chain = capChain(t, 2)
	envByAgent1, err := SignEnvelope(capKey(t, 2), capFields(capRequest(t, chain)))
	if err != nil {
		t.Fatal(err)
	}
	chain.Delegations[1].Signature = &envByAgent1
	res = a.Authorize(capRequest(t, chain))
	if !slices.Contains(res.Codes, schemas.CodeSignatureInvalid) {
		t.Fatalf("envelope signature accepted as a delegation signature: %v", res.Codes)
	}
	capHasDetail(t, res, "link 2: delegator signature does not verify")

	// The holder (agent-2) signs link-shaped objects; neither verifies as
	// the sender signature.
	chain = capChain(t, 2)
	r := capRequest(t, chain)
	holder := capKey(t, 3)
	capWantCodes(t, a.Authorize(r))
	for _, sig := range []*schemas.Signature{
		rawSign(t, holder, &chain.Capability),
		rawSign(t, holder, &chain.Delegations[1]),
	} {
		r := *r
		r.SenderSignature = capTree(t, sig)
		res := a.Authorize(&r)
		capWantCodes(t, res, schemas.CodeSignatureInvalid)
		capHasDetail(t, res, "sender_signature: does not match")
	}

	// 4. Field-set confusion: the holder signed the envelope's exact
	// fields but typed as a capability (or a delegation); the verifier
	// always rebuilds the envelope type, so it fails.
	for _, typ := range []string{schemas.CapabilityTypeV1, schemas.DelegationTypeV1, ""} {
		f := capFields(r)
		f.Type = typ
		rr := *r
		rr.SenderSignature = capTree(t, rawSign(t, holder, &f))
		res := a.Authorize(&rr)
		capWantCodes(t, res, schemas.CodeSignatureInvalid)
	}

	// 5. A capability typed as a delegation (or the reverse) is rejected
	// before any signature is checked.
	chain = capChain(t, 1)
	chain.Capability.Type = schemas.DelegationTypeV1
	chain.Capability.Signature = rawSign(t, issuer, &chain.Capability)
	res = a.Authorize(capRequest(t, chain))
	if !slices.Contains(res.Codes, schemas.CodeSignatureInvalid) {
		t.Fatalf("delegation-typed root: %v", res.Codes)
	}
	capHasDetail(t, res, "/capability/capability/type: const")
	chain = capChain(t, 1)
	chain.Delegations[0].Type = schemas.CapabilityTypeV1
	chain.Delegations[0].Signature = rawSign(t, capKey(t, 1), &chain.Delegations[0])
	res = a.Authorize(capRequest(t, chain))
	capWantCodes(t, res, schemas.CodeDelegationInvalid)
	capHasDetail(t, res, "/capability/delegations/0/type: const")
}
