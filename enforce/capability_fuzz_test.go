package enforce

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// FuzzCapabilityChain: starting from a valid chain of three delegations,
// any change to the chain (its bytes, or one member of one link set to
// another string) that changes its canonical form must not authorize —
// even with the envelope re-signed by the holder over the changed chain,
// as a holder trying to widen its capability would. A change that keeps
// the canonical form (whitespace, key order, escapes) still authorizes.
//
// Inputs: data is the chain's JSON; when field > 0, member (field-1) mod
// n, in sorted key order, of link (link mod 4: 0 the root, i delegation
// i) of data's tree is set to val.
func FuzzCapabilityChain(f *testing.F) {
	chain := capChain(f, 3)
	orig, err := json.Marshal(chain)
	if err != nil {
		f.Fatal(err)
	}
	origCanon, err := jsonkit.Canonicalize(orig)
	if err != nil {
		f.Fatal(err)
	}
	a := capAuthorizer(f)
	holder := capKey(f, 4)

	indented, _ := json.MarshalIndent(chain, "", "  ")
	seeds := [][]byte{
		orig,
		indented,
		origCanon,
		// Same string, escaped differently: canonically equal.
		bytes.Replace(orig, []byte(`"agent-3"`), []byte(`"agent\u002d3"`), 1),
		// Leaf scope widened.
		bytes.Replace(orig, []byte(`resource:/work/src/*`), []byte(`resource:/work/*`), 1),
		// Middle delegation lives longer.
		bytes.Replace(orig, []byte(chain.Delegations[1].ExpiresAt), []byte(chain.Capability.ExpiresAt), 1),
		// Root scope changed.
		bytes.Replace(orig, []byte(`"tool:docs:*"`), []byte(`"tool:mail:*"`), 1),
		// A signature's trailing bits.
		bytes.Replace(orig, []byte(chain.Delegations[2].Signature.Sig), []byte(otherTrailingBitsF(chain.Delegations[2].Signature.Sig)), 1),
		// The holder key replaced with the issuer's.
		bytes.Replace(orig, []byte(chain.Delegations[2].DelegateePublicKey), []byte(PublicKeyString(capKey(f, 0).Public())), 1),
		// read_only added to a link.
		bytes.Replace(orig, []byte(`"delegator_id":"agent-1"`), []byte(`"constraints":{"read_only":true},"delegator_id":"agent-1"`), 1),
		// Delegations dropped or reordered.
		capJSON(f, schemas.CapabilityChain{Capability: chain.Capability, Delegations: chain.Delegations[:2]}),
		capJSON(f, schemas.CapabilityChain{Capability: chain.Capability, Delegations: []schemas.Delegation{chain.Delegations[0], chain.Delegations[2], chain.Delegations[1]}}),
		// A member added at the top.
		bytes.Replace(orig, []byte(`{"capability":`), []byte(`{"x":1,"capability":`), 1),
		// Not JSON.
		orig[:len(orig)/2],
	}
	for _, s := range seeds {
		f.Add(s, uint8(0), uint8(0), "")
	}
	// Structured corruptions: one member of one link.
	for link := range uint8(4) {
		for field := range uint8(12) {
			f.Add(orig, link, field+1, "tool:*")
		}
	}
	f.Add(orig, uint8(3), uint8(3), "agent-3") // delegatee_id set to its own value: unchanged

	f.Fuzz(func(t *testing.T, data []byte, link, field uint8, val string) {
		var chainArg any = json.RawMessage(data)
		canon, cerr := jsonkit.Canonicalize(data)
		if field > 0 && cerr == nil {
			var tree map[string]any
			d := json.NewDecoder(bytes.NewReader(canon))
			d.UseNumber()
			if d.Decode(&tree) == nil && tree != nil {
				setLinkMember(tree, int(link%4), int(field-1), val)
				chainArg = tree
				canon, cerr = jsonkit.CanonicalTree(tree)
			}
		}
		r := &AuthRequest{
			Chain: chainArg, ServerID: "files", ToolName: "read_file", Resource: "/work/src/main.go", HasResource: true,
			Class: schemas.ClassRead, RequestHash: strings.Repeat("ab", 32), CorrelationID: "q3V2bH7pR9sT1uW4xY6zAb",
			SessionID: "session-1", IssuedAt: capNow.Format(schemas.TimeFormat), Now: capNow,
		}
		if cerr == nil {
			sum := sha256.Sum256(canon)
			r.ChainHash = hex.EncodeToString(sum[:])
			sig, err := SignEnvelope(holder, capFields(r))
			if err != nil {
				t.Fatal(err)
			}
			r.SenderSignature = map[string]any{"alg": sig.Alg, "kid": sig.KID, "sig": sig.Sig}
		}
		res := a.Authorize(r)
		// The chain's bytes as received, cached or not, and the deferred
		// sender check give the result computed from scratch.
		want := capReference(t, r)
		capSameResult(t, "shared authorizer", res, want)
		rr := *r
		if raw, ok := chainArg.(json.RawMessage); ok {
			rr.ChainRaw = raw
		} else {
			rr.ChainRaw = capJSON(t, chainArg)
		}
		for _, deferSender := range []bool{false, true, false} {
			rr.DeferSender = deferSender
			got := a.Authorize(&rr)
			if got.Sender != nil {
				got.SenderVerified(verify.Verify(got.Sender.Pub, got.Sender.Message, got.Sender.Sig))
			}
			capSameResult(t, "with ChainRaw", got, want)
		}
		same := cerr == nil && bytes.Equal(canon, origCanon)
		if !same && res.OK() {
			t.Fatalf("a changed chain authorized:\n%s", canon)
		}
		if same && !res.OK() {
			t.Fatalf("an unchanged chain was denied: %v %v", res.Codes, res.Details)
		}
		if !same && len(res.Codes) > 0 && !slices.ContainsFunc(res.Codes, func(c string) bool {
			return c == schemas.CodeSignatureInvalid || c == schemas.CodeDelegationInvalid ||
				c == schemas.CodeExpired || c == schemas.CodeScopeMismatch || c == schemas.CodeToolClassMismatch
		}) {
			t.Fatalf("unexpected codes %v", res.Codes)
		}
	})
}

// setLinkMember sets member (index mod n, sorted keys) of a chain link.
func setLinkMember(tree map[string]any, link, index int, val string) {
	var obj map[string]any
	if link == 0 {
		obj, _ = tree["capability"].(map[string]any)
	} else if ds, ok := tree["delegations"].([]any); ok && link <= len(ds) {
		obj, _ = ds[link-1].(map[string]any)
	}
	if len(obj) == 0 {
		return
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	obj[keys[index%len(keys)]] = val
}

func capJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// otherTrailingBitsF flips the lowest (unused) bit of a base64url
// string's last character.
func otherTrailingBitsF(s string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, s[len(s)-1])
	return s[:len(s)-1] + string(alphabet[i^1])
}

// FuzzEnvelopeDigest: the directly written digest of a sender's signed
// fields equals sha256(JCS(fields)) for any strings, invalid UTF-8,
// control characters and escapes included.
func FuzzEnvelopeDigest(f *testing.F) {
	f.Add("q3V2bH7pR9sT1uW4xY6zAb", strings.Repeat("ab", 32), "files:read_file", "2025-01-15T10:00:00.000Z", "session-1", "\"\\\x00\x1f\x7f\u2028\U0001F600\xff\xc3")
	f.Fuzz(func(t *testing.T, corr, hash, tool, ts, session, other string) {
		for _, fields := range []schemas.EnvelopeSignedFields{
			{Type: schemas.EnvelopeSignatureV1, CorrelationID: corr, CapabilityHash: hash, RequestHash: hash,
				Tool: tool, Method: schemas.MethodToolsCall, Timestamp: ts, SessionID: session},
			{Type: other, CorrelationID: other, CapabilityHash: other, RequestHash: other,
				Tool: other, Method: other, Timestamp: other, SessionID: other},
		} {
			want, err := canonicalSum(&fields)
			if err != nil {
				t.Fatal(err)
			}
			if envelopeDigest(&fields) != want {
				t.Fatalf("digest differs from sha256(JCS(%+v))", fields)
			}
		}
	})
}
