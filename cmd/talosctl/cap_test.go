package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
	"github.com/talos-audit/talos/testenv"
)

// TestCapCommands runs the real talosctl binary: keys gen, cap issue, cap
// delegate, cap inspect (valid: exit 0), then a tampered, an untrusted, an
// out-of-scope and an expired chain (exit 1, naming the code), and the
// refusals of delegate and issue. No NATS is involved.
func TestCapCommands(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	genKeys(t, bin, dir, "issuer", "agent0", "agent1", "other")

	out, code := run(t, bin, "cap", "issue", "--issuer-key", p("issuer.key"), "--subject", "agent-0", "--subject-key", p("agent0.pub"),
		"--scope", "tool:files:*", "--scope", "tool:docs:*", "--ttl", "1h", "--id", "cap-root", "--out", p("root.json"))
	if code != 0 || !strings.Contains(out, "issued "+p("root.json")) {
		t.Fatalf("cap issue: exit %d\n%s", code, out)
	}
	out, code = run(t, bin, "cap", "delegate", "--from", p("root.json"), "--holder-key", p("agent0.key"), "--to", "agent-1",
		"--to-key", p("agent1.pub"), "--scope", "tool:files:read_file/resource:/work/*", "--read-only", "--id", "cap-d1", "--out", p("chain.json"))
	if code != 0 || !strings.Contains(out, "holder        agent-1") {
		t.Fatalf("cap delegate: exit %d\n%s", code, out)
	}
	chain, err := schemas.ReadCapabilityChainFile(p("chain.json"))
	if err != nil || len(chain.Delegations) != 1 || chain.Delegations[0].Constraints == nil || !chain.Delegations[0].Constraints.ReadOnly {
		t.Fatalf("written chain: %+v %v", chain, err)
	}

	// Valid: exit 0, every link printed, with its expiry.
	out, code = run(t, bin, "cap", "inspect", p("chain.json"), "--issuers", p("issuer.pub"))
	if code != 0 {
		t.Fatalf("inspect: exit %d\n%s", code, out)
	}
	for _, want := range []string{"link 0  capability  cap-root", "link 1  delegation  cap-d1", "tool:files:read_file/resource:/work/*",
		"expires in ", "holder      agent-1", "chain hash  ", "verdict       VALID"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	// --json, with a covered call.
	out, code = run(t, bin, "--json", "cap", "inspect", p("chain.json"), "--issuers", p("issuer.pub"),
		"--server", "files", "--tool", "read_file", "--resource", "/work/a.txt")
	var js struct {
		Valid     bool                `json:"valid"`
		Holder    string              `json:"holder"`
		ChainHash string              `json:"chain_hash"`
		Links     []enforce.ChainLink `json:"links"`
		Codes     []string            `json:"codes"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &js) != nil || !js.Valid || js.Holder != "agent-1" || len(js.Links) != 2 || len(js.Codes) != 0 {
		t.Fatalf("inspect --json: exit %d\n%s", code, out)
	}
	if h, _ := enforce.ChainHash(chain); h != js.ChainHash {
		t.Fatalf("chain hash %s, want %s", js.ChainHash, h)
	}

	// Invalid verdicts: exit 1 with the code printed.
	tampered, _ := os.ReadFile(p("chain.json"))
	tampered = []byte(strings.Replace(string(tampered), "tool:files:read_file/resource:/work/*", "tool:files:read_file", 1))
	if err := os.WriteFile(p("tampered.json"), tampered, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"tampered", []string{p("tampered.json"), "--issuers", p("issuer.pub")}, "INVALID: SIGNATURE_INVALID"},
		{"untrusted issuer", []string{p("chain.json"), "--issuers", p("other.pub")}, "link 0: signed by an untrusted issuer key"},
		{"no issuers", []string{p("chain.json")}, "no --issuers given"},
		{"out of scope", []string{p("chain.json"), "--issuers", p("issuer.pub"), "--server", "files", "--tool", "write_file"}, "INVALID: SCOPE_MISMATCH"},
		{"no resource", []string{p("chain.json"), "--issuers", p("issuer.pub"), "--server", "files", "--tool", "read_file"}, "SCOPE_MISMATCH"},
		{"expired", []string{p("chain.json"), "--issuers", p("issuer.pub"), "--at", time.Now().Add(3 * time.Hour).Format(time.RFC3339)}, "INVALID: EXPIRED"},
		{"revoked", []string{p("chain.json"), "--issuers", p("issuer.pub"), "--revoked", "cap-root"}, "INVALID: REVOKED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := run(t, bin, append([]string{"cap", "inspect"}, tc.args...)...)
			if code != 1 || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want 1 and %q:\n%s", code, tc.want, out)
			}
		})
	}
	// An invalid chain is still shown link by link.
	if out, code := run(t, bin, "cap", "inspect", p("tampered.json"), "--issuers", p("issuer.pub")); code != 1 ||
		!strings.Contains(out, "link 1  delegation  cap-d1") || !strings.Contains(out, "link 1: delegator signature does not verify") {
		t.Fatalf("tampered chain: exit %d\n%s", code, out)
	}

	// Refusals.
	out, code = run(t, bin, "cap", "delegate", "--from", p("chain.json"), "--holder-key", p("agent1.key"), "--to", "x",
		"--to-key", p("other.pub"), "--scope", "tool:files:*")
	if code != 1 || !strings.Contains(out, "child_scope[0] is not contained") {
		t.Fatalf("widening delegate: exit %d\n%s", code, out)
	}
	out, code = run(t, bin, "cap", "delegate", "--from", p("chain.json"), "--holder-key", p("agent0.key"), "--to", "x",
		"--to-key", p("other.pub"), "--scope", "tool:files:read_file/resource:/work/a")
	if code != 1 || !strings.Contains(out, "not the parent's holder key") {
		t.Fatalf("delegate by a non-holder: exit %d\n%s", code, out)
	}
	out, code = run(t, bin, "cap", "issue", "--issuer-key", p("issuer.key"), "--subject", "a", "--subject-key", p("agent0.pub"), "--scope", "files:*")
	if code != 2 || !strings.Contains(out, "scope syntax") {
		t.Fatalf("bad scope: exit %d\n%s", code, out)
	}
	// Issue to stdout.
	out, code = run(t, bin, "cap", "issue", "--issuer-key", p("issuer.key"), "--subject", "a", "--subject-key", p("agent0.pub"), "--scope", "tool:*", "--read-only")
	if code != 0 || schemas.ValidateCapabilityChain([]byte(out)) != nil || !strings.Contains(out, `"read_only": true`) {
		t.Fatalf("issue to stdout: exit %d\n%s", code, out)
	}
}

// TestCallSignsEnvelope: with --capability and --agent-key, talosctl
// call's envelope carries the chain, request_hash and a sender signature
// that the worker's Authorizer accepts from the parsed envelope, and the
// post event is signed again for its own issued_at.
func TestCallSignsEnvelope(t *testing.T) {
	dir := t.TempDir()
	issuer, _ := receipts.GenerateKey()
	agent, _ := receipts.GenerateKey()
	if err := receipts.WriteKeyPair(agent, filepath.Join(dir, "agent")); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	root, err := enforce.IssueCapability(issuer, schemas.Capability{CapabilityID: "cap-1", Issuer: "ops", Subject: "agent-7",
		SubjectPublicKey: enforce.PublicKeyString(agent.Public()), Scopes: []string{"tool:files:read_file"},
		IssuedAt: now.UTC().Format(schemas.TimeFormat), ExpiresAt: now.Add(time.Hour).UTC().Format(schemas.TimeFormat)})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.MarshalIndent(schemas.CapabilityChain{Capability: root}, "", "    ")
	if err := os.WriteFile(filepath.Join(dir, "chain.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	c := &callCmd{Capability: filepath.Join(dir, "chain.json"), AgentKey: filepath.Join(dir, "agent.key")}
	signer, err := c.capSigner()
	if err != nil {
		t.Fatal(err)
	}
	if signer.Holder() != "agent-7" {
		t.Fatalf("holder %q", signer.Holder())
	}
	call, err := ep.NewCall("ep", "files", "read_file", json.RawMessage(`{"path": "/work/a", "n": 1.0}`))
	if err != nil {
		t.Fatal(err)
	}
	call.Actor.AgentID = signer.Holder()
	if err := signer.Sign(call); err != nil {
		t.Fatal(err)
	}
	ks := verify.KeySet{}
	ks.Add(issuer.Public())
	authz, err := enforce.NewAuthorizer(enforce.CapabilityConfig{Issuers: ks})
	if err != nil {
		t.Fatal(err)
	}
	authorize := func(call *schemas.ToolCall) enforce.AuthResult {
		raw, err := json.Marshal(call)
		if err != nil {
			t.Fatal(err)
		}
		pc, err := schemas.ParseToolCall(raw, schemas.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		reqCanon, _ := jsonkit.CanonicalTree(pc.Doc["request"])
		if h := sha256Hex(reqCanon); h != pc.Call.RequestHash {
			t.Fatalf("request_hash %s, want %s", pc.Call.RequestHash, h)
		}
		return authz.Authorize(&enforce.AuthRequest{
			Chain: pc.Doc["capability"], ServerID: pc.Call.ServerID, ToolName: pc.Call.ToolName, Class: schemas.ClassRead,
			RequestHash: pc.Call.RequestHash, CorrelationID: pc.Call.CorrelationID, SessionID: pc.Call.SessionID,
			IssuedAt: pc.Call.IssuedAt, SenderSignature: pc.Doc["sender_signature"], AgentID: pc.Call.Actor.AgentID, Now: now,
		})
	}
	if res := authorize(call); !res.OK() {
		t.Fatalf("pre: %v %v", res.Codes, res.Details)
	}
	post, err := ep.PostOf(call, json.RawMessage(`{"content":[]}`), true, now, now.Add(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if res := authorize(post); res.OK() {
		t.Fatal("post with the pre signature authorized although its issued_at changed")
	}
	if err := signer.Sign(post); err != nil {
		t.Fatal(err)
	}
	if res := authorize(post); !res.OK() {
		t.Fatalf("post: %v %v", res.Codes, res.Details)
	}
	// Without a key: the chain and request_hash, no signature.
	unsigned, err := ep.NewCallSigner(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	call2, _ := ep.NewCall("ep", "files", "read_file", json.RawMessage(`{}`))
	if err := unsigned.Sign(call2); err != nil || call2.SenderSignature != nil || call2.Capability == nil || call2.RequestHash == "" {
		t.Fatalf("unsigned: %v %+v", err, call2)
	}
	if res := authorize(call2); len(res.Codes) != 1 || res.Codes[0] != schemas.CodeSignatureInvalid {
		t.Fatalf("unsigned: %v", res.Codes)
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
