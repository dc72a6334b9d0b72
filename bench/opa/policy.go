// Package opa is the measured comparison between Talos's decision engine
// and Open Policy Agent: policy/seed000.rego implements the REG 9.2 rules
// that enforce.Engine.DecidePre applies to a phase-pre tool call, and the
// benchmarks of this package time OPA and Talos on the same 2 KB envelope,
// parsing included. It is a module of its own so that the Talos module
// never depends on OPA. Run it from this folder:
//
//	go test -run x -bench . -benchmem
//
// The tests check that the policy decides as the engine does.
package opa

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

//go:embed policy/seed000.rego
var seed000Policy string

// Policy is the REG 9.2 policy prepared once against one pinned registry;
// Decide evaluates it per call. It is safe for concurrent use.
type Policy struct {
	query rego.PreparedEvalQuery
}

// Decision is the policy's answer for one envelope: "allow" or "deny", and
// the reason codes found (sorted).
type Decision struct {
	Decision    string
	ReasonCodes []string
}

// New prepares the policy for a registry bundle: its manifests (JSON, as
// enforce.NewRegistry takes them), the digest the engine computes for
// them, and the mode ("prod" or "dev").
func New(ctx context.Context, mode, digest string, manifests ...[]byte) (*Policy, error) {
	tools := map[string]any{}
	for i, raw := range manifests {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		var m struct {
			ServerID string           `json:"server_id"`
			Tools    []map[string]any `json:"tools"`
		}
		if err := d.Decode(&m); err != nil {
			return nil, fmt.Errorf("opa: manifest #%d: %w", i, err)
		}
		byName := map[string]any{}
		for _, t := range m.Tools {
			name, _ := t["tool_name"].(string)
			byName[name] = t
		}
		tools[m.ServerID] = byName
	}
	data := map[string]any{"talos": map[string]any{"mode": mode, "digest": digest, "tools": tools}}
	q, err := rego.New(
		rego.Query("data.talos.seed000.result"),
		rego.Module("seed000.rego", seed000Policy),
		rego.Store(inmem.NewFromObject(data)),
	).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("opa: prepare: %w", err)
	}
	return &Policy{query: q}, nil
}

// Decide parses a tool call envelope and evaluates the prepared policy on
// it.
func (p *Policy) Decide(ctx context.Context, envelope []byte) (Decision, error) {
	input, err := ast.ValueFromReader(bytes.NewReader(envelope))
	if err != nil {
		return Decision{}, fmt.Errorf("opa: input: %w", err)
	}
	rs, err := p.query.Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return Decision{}, fmt.Errorf("opa: eval: %w", err)
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return Decision{}, errors.New("opa: no result")
	}
	res, ok := rs[0].Expressions[0].Value.(map[string]any)
	if !ok {
		return Decision{}, errors.New("opa: result is not an object")
	}
	var d Decision
	d.Decision, _ = res["decision"].(string)
	codes, _ := res["reason_codes"].([]any)
	for _, c := range codes {
		s, _ := c.(string)
		d.ReasonCodes = append(d.ReasonCodes, s)
	}
	return d, nil
}
