package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// benchEnvelopeBytes is the size the benchmark envelope is padded to.
const benchEnvelopeBytes = 2048

// benchEnvelope2KB is a phase-pre envelope as an enforcement point that
// signs its calls sends it (ingest/ep.CallSigner: the canonical capability
// chain, request_hash, sender_signature by the chain's holder), for a
// write document operation of the test registry (files/write_file), so
// that every REG 9.2 rule of DecidePre runs: classification, the
// declared class, registry parity, the idempotency key, and the document
// rules with an expected hash. The document is padded so the envelope is
// benchEnvelopeBytes long.
func benchEnvelope2KB(t testing.TB, e *Engine) []byte {
	t.Helper()
	chain := capChain(t, 0)
	canonChain, err := jsonkit.MarshalCanonical(chain)
	if err != nil {
		t.Fatal(err)
	}
	chainHash, err := ChainHash(chain)
	if err != nil {
		t.Fatal(err)
	}
	build := func(content string) []byte {
		call := schemas.ToolCall{
			SchemaVersion: schemas.ToolCallSchemaVersion, Phase: schemas.PhasePre,
			ToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", TraceID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f",
			CorrelationID: "q3V2bH7pR9sT1uW4xY6zAb", SessionID: "session-1a2b3c4d", EPID: "bench-1a2b3c4d-0",
			ServerID: "files", ToolName: "write_file", Transport: "mcp",
			Actor:    schemas.Actor{Kind: "agent", AgentID: capAgent(0)},
			IssuedAt: capNow.Format(schemas.TimeFormat), ToolClass: schemas.ClassWrite, IdempotencyKey: "idem-1a2b3c4d",
			RegistryDigest: e.Registry().Digest(),
		}
		args, err := json.Marshal(map[string]string{"path": "bench/report.txt", "content": content})
		if err != nil {
			t.Fatal(err)
		}
		call.Request = schemas.Request{Name: call.ToolName, Arguments: args}
		sum := sha256.Sum256([]byte(content))
		call.ExpectedDocumentHashes = []schemas.ExpectedHash{{Pointer: "/content", Hash: hex.EncodeToString(sum[:])}}
		req, err := jsonkit.MarshalCanonical(call.Request)
		if err != nil {
			t.Fatal(err)
		}
		sum = sha256.Sum256(req)
		call.RequestHash = hex.EncodeToString(sum[:])
		call.Capability = canonChain
		sig, err := SignEnvelope(capKey(t, 1), schemas.EnvelopeSignedFields{
			CorrelationID: call.CorrelationID, CapabilityHash: chainHash, RequestHash: call.RequestHash,
			Tool: call.ServerID + ":" + call.ToolName, Method: schemas.MethodToolsCall,
			Timestamp: call.IssuedAt, SessionID: call.SessionID,
		})
		if err != nil {
			t.Fatal(err)
		}
		if call.SenderSignature, err = json.Marshal(sig); err != nil {
			t.Fatal(err)
		}
		raw, err := json.Marshal(call)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	pad := benchEnvelopeBytes - len(build(""))
	if pad < 0 {
		t.Fatalf("the envelope without a document is already %d bytes", benchEnvelopeBytes-pad)
	}
	raw := build(strings.Repeat("Talos receipt chain per core. ", pad/30+1)[:pad])
	if len(raw) != benchEnvelopeBytes {
		t.Fatalf("benchmark envelope is %d bytes, want %d", len(raw), benchEnvelopeBytes)
	}
	return raw
}

// BenchmarkParseAndDecidePre2KB is the worker's per-call decision cost
// before any capability check or signing: schemas.ParseToolCall of a 2 KB
// signed envelope, then Engine.DecidePre.
func BenchmarkParseAndDecidePre2KB(b *testing.B) {
	e := testEngine(b, ModeProd)
	raw := benchEnvelope2KB(b, e)
	pc, err := schemas.ParseToolCall(raw, schemas.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	if out := e.DecidePre(pc); out.Decision != schemas.DecisionAllow || len(out.DocumentHashes) != 1 {
		b.Fatalf("benchmark envelope: %s %v %v", out.Decision, out.ReasonCodes, out.Details)
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		pc, err := schemas.ParseToolCall(raw, schemas.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		if out := e.DecidePre(pc); out.Decision != schemas.DecisionAllow {
			b.Fatal(out.ReasonCodes)
		}
	}
}
