package ingest_test

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// capFixture issues capabilities for the capability pipeline tests: one
// trusted issuer, one untrusted, and agent keys.
type capFixture struct {
	issuer, rogue, agent, other *receipts.PrivateKey
	now                         time.Time
}

func newCapFixture(t *testing.T) *capFixture {
	t.Helper()
	f := &capFixture{now: time.Now().UTC()}
	for _, k := range []**receipts.PrivateKey{&f.issuer, &f.rogue, &f.agent, &f.other} {
		var err error
		if *k, err = receipts.GenerateKey(); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// root issues a capability for "agent-a" with scopes, valid from
// now-from to now+until, signed by signer.
func (f *capFixture) root(t *testing.T, signer *receipts.PrivateKey, scopes []string, readOnly bool, from, until time.Duration) *schemas.CapabilityChain {
	t.Helper()
	c := schemas.Capability{
		CapabilityID:     uuid.NewString(),
		Issuer:           "test-issuer",
		Subject:          "agent-a",
		SubjectPublicKey: enforce.PublicKeyString(f.agent.Public()),
		Scopes:           scopes,
		IssuedAt:         f.now.Add(-from).Format(schemas.TimeFormat),
		ExpiresAt:        f.now.Add(until).Format(schemas.TimeFormat),
	}
	if readOnly {
		c.Constraints = &schemas.Constraints{ReadOnly: true}
	}
	c, err := enforce.IssueCapability(signer, c)
	if err != nil {
		t.Fatal(err)
	}
	return &schemas.CapabilityChain{Capability: c}
}

// capStack is a pipeline whose worker requires capabilities from
// f.issuer, keeps a shared call ledger and checks replays.
func capStack(t *testing.T, f *capFixture) *stack {
	t.Helper()
	return newStack(t, stackOptions{configure: func(t *testing.T, js jetstream.JetStream, o *enforce.DeciderOptions) {
		issuers := verify.KeySet{}
		issuers.Add(f.issuer.Public())
		a, err := enforce.NewAuthorizer(enforce.CapabilityConfig{Issuers: issuers})
		if err != nil {
			t.Fatal(err)
		}
		o.Capabilities, o.RequireCapability, o.Ledger = a, true, newLedger(t, js)
	}})
}

func signed(t *testing.T, c *schemas.ToolCall, chain *schemas.CapabilityChain, key *receipts.PrivateKey) *schemas.ToolCall {
	t.Helper()
	b, err := json.Marshal(chain)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ep.NewCallSigner(b, key)
	if err != nil {
		t.Fatal(err)
	}
	c.Actor.AgentID = s.Holder()
	if err := s.Sign(c); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCapabilityDenialsThroughPipeline sends, through real NATS, one call
// per code of the capability denial taxonomy (and the allow they are
// measured against), and finds each receipt in ClickHouse with its code,
// capability hash and the chain's capability ids.
func TestCapabilityDenialsThroughPipeline(t *testing.T) {
	f := newCapFixture(t)
	s := capStack(t, f)
	read := []string{"tool:files:read_file/resource:docs/*", "tool:files:write_file", "tool:files:list_directory"}
	good := f.root(t, f.issuer, read, false, time.Minute, time.Hour)
	readFile := func(path string) *schemas.ToolCall {
		return newCall(t, "files", "read_file", map[string]any{"path": path})
	}

	// A chain delegated to agent-b that widens its parent's scope.
	wide, err := enforce.Delegate(f.agent, good.Capability, schemas.Delegation{
		CapabilityID: uuid.NewString(), ChildScope: []string{"tool:files:read_file/resource:docs/*"},
		IssuedAt: f.now.Add(-time.Second).Format(schemas.TimeFormat), ExpiresAt: f.now.Add(time.Minute).Format(schemas.TimeFormat),
		DelegateeID: "agent-b", DelegateePublicKey: enforce.PublicKeyString(f.other.Public()),
	})
	if err != nil {
		t.Fatal(err)
	}
	wide.ChildScope = []string{"tool:*"} // widened after signing is SIGNATURE_INVALID; re-sign as agent-a would
	wideChain := &schemas.CapabilityChain{Capability: good.Capability, Delegations: []schemas.Delegation{resignDelegation(t, f.agent, wide)}}

	revoked := f.root(t, f.issuer, read, false, time.Minute, time.Hour)
	applyRevoke(t, s, revoked.Capability.CapabilityID)

	cases := []struct {
		name string
		call func() *schemas.ToolCall
		code string // "" = allow
	}{
		{"valid chain", func() *schemas.ToolCall { return signed(t, readFile("docs/a.md"), good, f.agent) }, ""},
		{"no capability", func() *schemas.ToolCall { return readFile("docs/a.md") }, schemas.CodeNoCapability},
		{"untrusted issuer", func() *schemas.ToolCall {
			return signed(t, readFile("docs/a.md"), f.root(t, f.rogue, read, false, time.Minute, time.Hour), f.agent)
		}, schemas.CodeSignatureInvalid},
		{"sender signature by another key", func() *schemas.ToolCall { return signed(t, readFile("docs/a.md"), good, f.other) }, schemas.CodeSignatureInvalid},
		{"expired", func() *schemas.ToolCall {
			return signed(t, readFile("docs/a.md"), f.root(t, f.issuer, read, false, 3*time.Hour, -2*time.Hour), f.agent)
		}, schemas.CodeExpired},
		{"revoked", func() *schemas.ToolCall { return signed(t, readFile("docs/a.md"), revoked, f.agent) }, schemas.CodeRevoked},
		{"resource out of scope", func() *schemas.ToolCall { return signed(t, readFile("src/main.go"), good, f.agent) }, schemas.CodeScopeMismatch},
		{"delegation widens scope", func() *schemas.ToolCall {
			c := readFile("docs/a.md")
			c.Actor.AgentID = "agent-b"
			return signed(t, c, wideChain, f.other)
		}, schemas.CodeDelegationInvalid},
		{"request changed after signing", func() *schemas.ToolCall {
			c := signed(t, readFile("docs/a.md"), good, f.agent)
			c.Request.Arguments = json.RawMessage(`{"path":"docs/b.md"}`)
			return c
		}, schemas.CodeRequestHashMismatch},
		{"read-only capability on a write tool", func() *schemas.ToolCall {
			c := newCall(t, "files", "write_file", map[string]any{"path": "docs/a.md", "content": "x"})
			c.IdempotencyKey = "ro-1"
			return signed(t, c, f.root(t, f.issuer, read, true, time.Minute, time.Hour), f.agent)
		}, schemas.CodeToolClassMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			call := tc.call()
			d := s.call(t, call)
			if tc.code == "" {
				if d.Decision != schemas.DecisionAllow {
					t.Fatalf("got %s %v, want allow (details %v)", d.Decision, d.ReasonCodes, d.Details)
				}
			} else if d.Decision != schemas.DecisionDeny || !slices.Contains(d.ReasonCodes, tc.code) {
				t.Fatalf("got %s %v, want deny with %s (details %v)", d.Decision, d.ReasonCodes, tc.code, d.Details)
			}
			// The receipt in ClickHouse names the code and the chain.
			where := fmt.Sprintf("receipt_id = '%s'", d.ReceiptID)
			if tc.code != "" {
				where += fmt.Sprintf(" AND has(reason_codes, '%s')", tc.code)
			}
			s.waitRows(t, query.ViewReceipts, where, 1)
			var capHash string
			var capIDs []string
			if err := s.conn.QueryRow(context.Background(), fmt.Sprintf(
				"SELECT capability_hash, capability_ids FROM %s.receipts WHERE receipt_id = '%s' LIMIT 1", s.db, d.ReceiptID)).Scan(&capHash, &capIDs); err != nil {
				t.Fatal(err)
			}
			if len(call.Capability) > 0 && len(capHash) != 64 {
				t.Fatalf("receipt capability_hash %q", capHash)
			}
			if tc.code == "" && !slices.Equal(capIDs, []string{good.Capability.CapabilityID}) {
				t.Fatalf("receipt capability_ids %v, want [%s]", capIDs, good.Capability.CapabilityID)
			}
		})
	}

	t.Run("replayed correlation id", func(t *testing.T) {
		first := signed(t, readFile("docs/a.md"), good, f.agent)
		if d := s.call(t, first); d.Decision != schemas.DecisionAllow {
			t.Fatalf("first: %s %v", d.Decision, d.ReasonCodes)
		}
		again := readFile("docs/a.md")
		again.SessionID, again.CorrelationID = first.SessionID, first.CorrelationID
		d := s.call(t, signed(t, again, good, f.agent))
		if !slices.Contains(d.ReasonCodes, schemas.CodeReplay) {
			t.Fatalf("replay: %s %v", d.Decision, d.ReasonCodes)
		}
		s.waitRows(t, query.ViewReceipts, fmt.Sprintf("receipt_id = '%s' AND has(reason_codes, 'REPLAY')", d.ReceiptID), 1)
	})

	t.Run("idempotency key bound to the request", func(t *testing.T) {
		write := func(content string) *schemas.ToolCall {
			c := newCall(t, "files", "write_file", map[string]any{"path": "docs/n.md", "content": content})
			c.IdempotencyKey = "idem-" + s.db
			return signed(t, c, good, f.agent)
		}
		first := s.call(t, write("v1"))
		if first.Decision != schemas.DecisionAllow {
			t.Fatalf("first write: %s %v %v", first.Decision, first.ReasonCodes, first.Details)
		}
		same := s.call(t, write("v1"))
		var r struct {
			Data schemas.Receipt `json:"data"`
		}
		if err := json.Unmarshal(same.Receipt, &r); err != nil {
			t.Fatal(err)
		}
		if same.Decision != schemas.DecisionAllow || r.Data.IdempotentOf == nil || r.Data.IdempotentOf.ReceiptID != first.ReceiptID {
			t.Fatalf("same request again: %s %v, idempotent_of %+v, want allow naming %s", same.Decision, same.ReasonCodes, r.Data.IdempotentOf, first.ReceiptID)
		}
		other := s.call(t, write("v2"))
		if other.Decision != schemas.DecisionDeny || !slices.Contains(other.ReasonCodes, schemas.CodeIdempotencyKeyReused) {
			t.Fatalf("different request, same key: %s %v", other.Decision, other.ReasonCodes)
		}
		s.waitRows(t, query.ViewReceipts, fmt.Sprintf("receipt_id = '%s' AND has(reason_codes, 'IDEMPOTENCY_KEY_REUSED')", other.ReceiptID), 1)
	})

	rep, err := query.VerifyDatabase(context.Background(), s.conn, s.db, s.keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("verify: %+v", rep.Problems)
	}
}

// resignDelegation signs d as is (no containment checks), as a careless
// delegator could.
func resignDelegation(t *testing.T, holder *receipts.PrivateKey, d schemas.Delegation) schemas.Delegation {
	t.Helper()
	d.Signature = nil
	b, err := jsonkit.MarshalCanonical(d)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	d.Signature = &schemas.Signature{Alg: "Ed25519", KID: holder.KID,
		Sig: base64.RawURLEncoding.EncodeToString(ed25519.Sign(holder.Key, sum[:]))}
	return d
}

// applyRevoke revokes a capability id on the stack's worker, as a
// control event would.
func applyRevoke(t *testing.T, s *stack, id string) {
	t.Helper()
	cmd := &schemas.ControlCommand{SchemaVersion: schemas.ControlCommandVersion, CommandID: uuid.NewString(),
		Verb: schemas.VerbRevoke, Actor: "test", Reason: "compromised", Target: id,
		IssuedAt: time.Now().UTC().Format(schemas.TimeFormat)}
	rec := &schemas.ControlRecord{CommandID: cmd.CommandID, Verb: cmd.Verb, Actor: cmd.Actor, Reason: cmd.Reason,
		Target: id, Accepted: true, Command: cmd, Seq: s.dec.State().Seq() + 1}
	if err := s.dec.Apply(rec.Seq, rec, time.Now()); err != nil {
		t.Fatal(err)
	}
}
