package enforce

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// capNow is the fixed "now" of the capability tests.
var capNow = time.Date(2025, 1, 15, 10, 0, 0, 0, time.UTC)

// capScopes are the scopes of each level of a fixture chain: level 0 is
// the root capability, level i the i-th delegation; each narrows the last.
var capScopes = [][]string{
	{"tool:files:*", "tool:docs:*"},
	{"tool:files:read_file", "tool:files:write_file"},
	{"tool:files:read_file/resource:/work/*"},
	{"tool:files:read_file/resource:/work/src/*"},
	{"tool:files:read_file/resource:/work/src/main*"},
}

// capKey returns a deterministic key: 0 is the issuer, 1+i the agent of
// level i ("agent-i").
func capKey(t testing.TB, n int) *receipts.PrivateKey {
	t.Helper()
	seed := bytes.Repeat([]byte{byte(n + 1)}, 32)
	k, err := receipts.NewKeyFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func capAgent(level int) string { return fmt.Sprintf("agent-%d", level) }

// capBuild describes a fixture chain. Hooks run after every field is
// filled and before signing, so they make signed-but-invalid links.
type capBuild struct {
	depth int
	root  func(c *schemas.Capability)
	deleg func(level int, d *schemas.Delegation)
	// signer overrides the key that signs a level (default: the issuer for
	// level 0, the parent's holder otherwise).
	signer func(level int) *receipts.PrivateKey
}

// rawSign signs a Capability or Delegation as is (no checks), the way a
// careless or malicious signer could.
func rawSign(t testing.TB, key *receipts.PrivateKey, obj any) *schemas.Signature {
	t.Helper()
	var sum [32]byte
	var err error
	switch o := obj.(type) {
	case *schemas.Capability:
		cp := *o
		cp.Signature = nil
		sum, err = canonicalSum(&cp)
	case *schemas.Delegation:
		cp := *o
		cp.Signature = nil
		sum, err = canonicalSum(&cp)
	case *schemas.EnvelopeSignedFields:
		sum, err = canonicalSum(o)
	default:
		t.Fatalf("rawSign %T", obj)
	}
	if err != nil {
		t.Fatal(err)
	}
	s, err := signDigest(key, sum)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (b capBuild) build(t testing.TB) *schemas.CapabilityChain {
	t.Helper()
	root := schemas.Capability{
		Type: schemas.CapabilityTypeV1, CapabilityID: "cap-root", Issuer: "talos-issuer",
		Subject: capAgent(0), SubjectPublicKey: PublicKeyString(capKey(t, 1).Public()),
		Scopes:   slices.Clone(capScopes[0]),
		IssuedAt: capNow.Add(-time.Hour).Format(schemas.TimeFormat), ExpiresAt: capNow.Add(time.Hour).Format(schemas.TimeFormat),
	}
	if b.root != nil {
		b.root(&root)
	}
	signer := capKey(t, 0)
	if b.signer != nil && b.signer(0) != nil {
		signer = b.signer(0)
	}
	root.Signature = rawSign(t, signer, &root)
	chain := &schemas.CapabilityChain{Capability: root}
	var parent any = root
	for level := 1; level <= b.depth; level++ {
		d := schemas.Delegation{
			Type: schemas.DelegationTypeV1, CapabilityID: fmt.Sprintf("cap-d%d", level),
			ChildScope:  slices.Clone(capScopes[min(level, len(capScopes)-1)]),
			IssuedAt:    capNow.Add(-time.Hour + time.Duration(level)*time.Minute).Format(schemas.TimeFormat),
			ExpiresAt:   capNow.Add(time.Hour - time.Duration(level)*time.Minute).Format(schemas.TimeFormat),
			DelegatorID: capAgent(level - 1), DelegateeID: capAgent(level),
			DelegateePublicKey: PublicKeyString(capKey(t, level+1).Public()),
		}
		h, err := CapabilityObjectHash(parent)
		if err != nil {
			t.Fatal(err)
		}
		d.ParentCapabilityHash = h
		if prev, ok := parent.(schemas.Delegation); ok && prev.Constraints != nil && prev.Constraints.ReadOnly {
			d.Constraints = &schemas.Constraints{ReadOnly: true}
		} else if c, ok := parent.(schemas.Capability); ok && c.Constraints != nil && c.Constraints.ReadOnly {
			d.Constraints = &schemas.Constraints{ReadOnly: true}
		}
		if b.deleg != nil {
			b.deleg(level, &d)
		}
		signer := capKey(t, level) // the parent's holder: agent level-1
		if b.signer != nil && b.signer(level) != nil {
			signer = b.signer(level)
		}
		d.Signature = rawSign(t, signer, &d)
		chain.Delegations = append(chain.Delegations, d)
		parent = d
	}
	return chain
}

// capChain is a valid fixture chain of depth delegations.
func capChain(t testing.TB, depth int) *schemas.CapabilityChain {
	return capBuild{depth: depth}.build(t)
}

// capTree is v as the envelope parser decodes it.
func capTree(t testing.TB, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

func capAuthorizer(t testing.TB) *Authorizer {
	t.Helper()
	ks := verify.KeySet{}
	ks.Add(capKey(t, 0).Public())
	a, err := NewAuthorizer(CapabilityConfig{Issuers: ks})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// capRequest is a request for files/read_file on /work/src/main.go (read)
// carrying chain, sender-signed by the chain's holder.
func capRequest(t testing.TB, chain *schemas.CapabilityChain) *AuthRequest {
	t.Helper()
	depth := len(chain.Delegations)
	h, err := ChainHash(chain)
	if err != nil {
		t.Fatal(err)
	}
	r := &AuthRequest{
		Chain: capTree(t, chain), ChainHash: h,
		ServerID: "files", ToolName: "read_file", Resource: "/work/src/main.go", HasResource: true,
		Class: schemas.ClassRead, RequestHash: strings.Repeat("ab", 32),
		CorrelationID: "q3V2bH7pR9sT1uW4xY6zAb", SessionID: "session-1",
		IssuedAt: capNow.Format(schemas.TimeFormat), AgentID: capAgent(depth), Now: capNow,
	}
	capSignSender(t, r, capKey(t, depth+1))
	return r
}

// capRawRequest is capRequest with ChainRaw: the bytes its tree was
// decoded from, as a worker passes them.
func capRawRequest(t testing.TB, chain *schemas.CapabilityChain) *AuthRequest {
	t.Helper()
	r := capRequest(t, chain)
	raw, err := json.Marshal(chain)
	if err != nil {
		t.Fatal(err)
	}
	r.ChainRaw = raw
	return r
}

// capFields are the envelope fields r's sender signature must cover.
func capFields(r *AuthRequest) schemas.EnvelopeSignedFields {
	return schemas.EnvelopeSignedFields{
		Type: schemas.EnvelopeSignatureV1, CorrelationID: r.CorrelationID, CapabilityHash: r.ChainHash,
		RequestHash: r.RequestHash, Tool: r.ServerID + ":" + r.ToolName, Method: schemas.MethodOf(r.MCPMethod),
		Timestamp: r.IssuedAt, SessionID: r.SessionID,
	}
}

// capSignSender (re)signs r's envelope fields with key.
func capSignSender(t testing.TB, r *AuthRequest, key *receipts.PrivateKey) {
	t.Helper()
	sig, err := SignEnvelope(key, capFields(r))
	if err != nil {
		t.Fatal(err)
	}
	r.SenderSignature = capTree(t, sig)
}

// capWantCodes fails unless res has exactly codes (in Authorize's order).
func capWantCodes(t testing.TB, res AuthResult, codes ...string) {
	t.Helper()
	if !slices.Equal(res.Codes, codes) {
		t.Fatalf("codes %v, want %v; details %v", res.Codes, codes, res.Details)
	}
}

// capHasDetail fails unless some detail contains sub.
func capHasDetail(t testing.TB, res AuthResult, sub string) {
	t.Helper()
	for _, d := range res.Details {
		if strings.Contains(d, sub) {
			return
		}
	}
	t.Fatalf("no detail contains %q: %v", sub, res.Details)
}
