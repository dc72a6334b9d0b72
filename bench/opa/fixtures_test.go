package opa

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// envelopeBytes is the size of the benchmark envelope.
const envelopeBytes = 2048

// fixedNow is the issue time of the fixture capability and envelopes.
var fixedNow = time.Date(2025, 1, 15, 10, 20, 30, 123e6, time.UTC)

// fixtureKey is deterministic: 0 is the capability issuer, 1 the agent.
func fixtureKey(t testing.TB, n int) *receipts.PrivateKey {
	t.Helper()
	k, err := receipts.NewKeyFromSeed(bytes.Repeat([]byte{byte(n + 1)}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// manifests are the registry manifests of testdata/registry.
func manifests(t testing.TB) [][]byte {
	t.Helper()
	files, err := filepath.Glob("testdata/registry/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no registry manifests: %v", err)
	}
	slices.Sort(files)
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// deciders are the engine and the policy over the same registry and mode.
func deciders(t testing.TB, mode enforce.Mode) (*enforce.Engine, *Policy) {
	t.Helper()
	ms := manifests(t)
	reg, err := enforce.NewRegistry(ms...)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforce.New(enforce.Config{Mode: mode, Registry: reg, NewEffectID: func() string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(context.Background(), string(mode), reg.Digest(), ms...)
	if err != nil {
		t.Fatal(err)
	}
	return e, p
}

// call describes a phase-pre envelope; the zero values of the optional
// fields leave them out.
type call struct {
	server, tool       string
	args               map[string]any
	toolClass, idemKey string
	registryDigest     string
	expected           []schemas.ExpectedHash
	readOnly           bool // the capability carries constraints.read_only
	unsigned           bool // no capability, request_hash or sender_signature
}

// envelope builds c's envelope the way a signing enforcement point does
// (ingest/ep.CallSigner): the canonical capability chain, request_hash, and
// the holder's sender_signature.
func envelope(t testing.TB, c call) []byte {
	t.Helper()
	args, err := json.Marshal(c.args)
	if err != nil {
		t.Fatal(err)
	}
	tc := schemas.ToolCall{
		SchemaVersion: schemas.ToolCallSchemaVersion, Phase: schemas.PhasePre,
		ToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", TraceID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f",
		CorrelationID: "q3V2bH7pR9sT1uW4xY6zAb", SessionID: "session-1a2b3c4d", EPID: "bench-1a2b3c4d-0",
		ServerID: c.server, ToolName: c.tool, Transport: "mcp",
		Actor:    schemas.Actor{Kind: "agent", AgentID: "agent-0"},
		Request:  schemas.Request{Name: c.tool, Arguments: args},
		IssuedAt: fixedNow.Format(schemas.TimeFormat), ToolClass: c.toolClass, IdempotencyKey: c.idemKey,
		RegistryDigest: c.registryDigest, ExpectedDocumentHashes: c.expected,
	}
	if !c.unsigned {
		agent := fixtureKey(t, 1)
		capability := schemas.Capability{
			CapabilityID: "cap-bench", Issuer: "talos-issuer", Subject: "agent-0",
			SubjectPublicKey: enforce.PublicKeyString(agent.Public()), Scopes: []string{"tool:files:*", "tool:limits:*"},
			IssuedAt: fixedNow.Add(-time.Hour).Format(schemas.TimeFormat), ExpiresAt: fixedNow.Add(time.Hour).Format(schemas.TimeFormat),
		}
		if c.readOnly {
			capability.Constraints = &schemas.Constraints{ReadOnly: true}
		}
		capability, err = enforce.IssueCapability(fixtureKey(t, 0), capability)
		if err != nil {
			t.Fatal(err)
		}
		chain := &schemas.CapabilityChain{Capability: capability}
		if tc.Capability, err = jsonkit.MarshalCanonical(chain); err != nil {
			t.Fatal(err)
		}
		chainHash, err := enforce.ChainHash(chain)
		if err != nil {
			t.Fatal(err)
		}
		req, err := jsonkit.MarshalCanonical(tc.Request)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(req)
		tc.RequestHash = hex.EncodeToString(sum[:])
		sig, err := enforce.SignEnvelope(agent, schemas.EnvelopeSignedFields{
			CorrelationID: tc.CorrelationID, CapabilityHash: chainHash, RequestHash: tc.RequestHash,
			Tool: tc.ServerID + ":" + tc.ToolName, Method: schemas.MethodToolsCall, Timestamp: tc.IssuedAt, SessionID: tc.SessionID,
		})
		if err != nil {
			t.Fatal(err)
		}
		if tc.SenderSignature, err = json.Marshal(sig); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := json.Marshal(tc)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// benchCall is the benchmark's call with document content: a write
// document operation that every REG 9.2 rule applies to.
func benchCall(digest, content string) call {
	return call{
		server: "files", tool: "write_file", args: map[string]any{"path": "bench/report.txt", "content": content},
		toolClass: schemas.ClassWrite, idemKey: "idem-1a2b3c4d", registryDigest: digest,
		expected: []schemas.ExpectedHash{{Pointer: "/content", Hash: hashOf(content)}},
	}
}

// benchEnvelope is the 2 KB benchmark envelope: benchCall padded to
// envelopeBytes.
func benchEnvelope(t testing.TB, e *enforce.Engine) []byte {
	t.Helper()
	digest := e.Registry().Digest()
	pad := envelopeBytes - len(envelope(t, benchCall(digest, "")))
	if pad < 0 {
		t.Fatalf("the envelope without content is %d bytes", envelopeBytes-pad)
	}
	raw := envelope(t, benchCall(digest, strings.Repeat("Talos receipt chain per core. ", pad/30+1)[:pad]))
	if len(raw) != envelopeBytes {
		t.Fatalf("benchmark envelope is %d bytes, want %d", len(raw), envelopeBytes)
	}
	return raw
}
