package opa

import (
	"context"
	"testing"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
)

// BenchmarkOPAParseAndDecide2KB: OPA parses the 2 KB envelope into its
// input value and evaluates the prepared REG 9.2 policy, per decision.
func BenchmarkOPAParseAndDecide2KB(b *testing.B) {
	ctx := context.Background()
	e, p := deciders(b, enforce.ModeProd)
	raw := benchEnvelope(b, e)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		d, err := p.Decide(ctx, raw)
		if err != nil || d.Decision != schemas.DecisionAllow {
			b.Fatal(d, err)
		}
	}
}

// BenchmarkTalosParseAndDecidePre2KB is the same decision by Talos on the
// same bytes: schemas.ParseToolCall (schema validation included) and
// enforce.Engine.DecidePre (which also checks request_hash).
func BenchmarkTalosParseAndDecidePre2KB(b *testing.B) {
	e, _ := deciders(b, enforce.ModeProd)
	raw := benchEnvelope(b, e)
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
