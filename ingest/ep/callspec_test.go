package ep

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// A CallSpec's envelope parses as a valid pre call carrying the spec's
// fields; the agent defaults to the signer's holder, then DefaultAgent;
// a signed one carries the chain and a sender signature.
func TestCallSpecEnvelope(t *testing.T) {
	spec := CallSpec{EPID: "ep1", Server: "files", Tool: "read_file", Args: json.RawMessage(`{"path":"/a"}`), Session: "s-1",
		IdempotencyKey: "k1", ToolClass: "read", ExpectedHashes: []schemas.ExpectedHash{{Pointer: "/path", Hash: "00"}}}
	call, err := spec.Envelope(nil)
	if err != nil {
		t.Fatal(err)
	}
	if call.Actor.AgentID != DefaultAgent || call.SessionID != "s-1" || call.IdempotencyKey != "k1" || call.ToolClass != "read" ||
		len(call.ExpectedDocumentHashes) != 1 || call.Phase != schemas.PhasePre || call.EPID != "ep1" {
		t.Fatalf("envelope %+v", call)
	}
	issuer, _ := receipts.GenerateKey()
	agent, _ := receipts.GenerateKey()
	now := time.Now().UTC()
	c, err := enforce.IssueCapability(issuer, schemas.Capability{CapabilityID: "cap-1", Issuer: "i", Subject: "holder-7",
		SubjectPublicKey: enforce.PublicKeyString(agent.Public()), Scopes: []string{"tool:files:*"},
		IssuedAt: now.Format(schemas.TimeFormat), ExpiresAt: now.Add(time.Hour).Format(schemas.TimeFormat)})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(schemas.CapabilityChain{Capability: c})
	signer, err := NewCallSigner(raw, agent)
	if err != nil {
		t.Fatal(err)
	}
	spec.ExpectedHashes = nil
	signed, err := spec.Envelope(signer)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(signed)
	parsed, err := schemas.ParseToolCall(b, schemas.Limits{})
	if err != nil {
		t.Fatalf("signed envelope: %v\n%s", err, b)
	}
	if parsed.Call.Actor.AgentID != "holder-7" || parsed.Call.SenderSignature == nil || signed.ExpectedDocumentHashes != nil {
		t.Fatalf("signed envelope %s", b)
	}
	spec.Agent = "named"
	if named, err := spec.Envelope(signer); err != nil || named.Actor.AgentID != "named" {
		t.Fatalf("--agent: %v, %v", named, err)
	}
}

func TestEnvelopeRoute(t *testing.T) {
	for raw, want := range map[string][3]string{
		`{"phase":"post","server_id":"files","tool_call_id":"c1"}`: {"post", "files", "c1"},
		`{"server_id":"files"}`: {schemas.PhasePre, "files", ""},
		`not json`:              {schemas.PhasePre, "", ""},
	} {
		p, s, id := EnvelopeRoute([]byte(raw))
		if [3]string{p, s, id} != want {
			t.Errorf("EnvelopeRoute(%s) = %s %s %s, want %v", raw, p, s, id, want)
		}
	}
}
