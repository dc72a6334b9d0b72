package schemas

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestCapabilityTypesPinned: the signed object types of
// capability.schema.json are the Go constants. (The structs are checked
// against the schema with the other wire structs in TestStructsMatchSchemas.)
func TestCapabilityTypesPinned(t *testing.T) {
	// The object types are pinned to the Go constants.
	for ptr, want := range map[string]string{
		"/$defs/capability/properties/type": CapabilityTypeV1,
		"/$defs/delegation/properties/type": DelegationTypeV1,
	} {
		if got := schemaNode(t, FileCapabilitySchema, ptr)["const"]; got != want {
			t.Errorf("%s const %v, want %s", ptr, got, want)
		}
	}
	if got := schemaNode(t, FileCapabilitySchema, "/properties/delegations")["maxItems"]; got != json.Number("3") && got != float64(MaxDelegationDepth) {
		t.Errorf("delegations maxItems %v (%T), want %d", got, got, MaxDelegationDepth)
	}
}

func fullCapabilityChain() CapabilityChain {
	sig := func(kid string) *Signature {
		return &Signature{Alg: SignatureAlg, KID: kid, Sig: strings.Repeat("A", 86)}
	}
	key := strings.Repeat("B", 43)
	return CapabilityChain{
		Capability: Capability{
			Type: CapabilityTypeV1, CapabilityID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", Issuer: "ops", Subject: "agent-0",
			SubjectPublicKey: key, Scopes: []string{"tool:files:*", "tool:*"}, Constraints: &Constraints{ReadOnly: true},
			IssuedAt: "2025-01-15T10:20:30.123Z", ExpiresAt: "2025-01-15T11:20:30.123Z", Signature: sig("0123456789abcdef"),
		},
		Delegations: []Delegation{{
			Type: DelegationTypeV1, CapabilityID: "cap-d1", ParentCapabilityHash: strings.Repeat("a", 64),
			ChildScope:  []string{"tool:files:read_file/method:get/resource:/work/*"},
			Constraints: &Constraints{ReadOnly: true}, IssuedAt: "2025-01-15T10:20:31Z", ExpiresAt: "2025-01-15T11:00:00Z",
			DelegatorID: "agent-0", DelegateeID: "agent-1", DelegateePublicKey: key, Signature: sig("fedcba9876543210"),
		}},
	}
}

func TestCapabilityChainValidates(t *testing.T) {
	c := fullCapabilityChain()
	b := mustJSON(t, c)
	assertAllKeys(t, reflect.TypeFor[CapabilityChain](), b)
	assertAllKeys(t, reflect.TypeFor[Capability](), mustJSON(t, c.Capability))
	assertAllKeys(t, reflect.TypeFor[Delegation](), mustJSON(t, c.Delegations[0]))
	assertAllKeys(t, reflect.TypeFor[Constraints](), mustJSON(t, c.Capability.Constraints))
	if err := ValidateCapabilityChain(b); err != nil {
		t.Fatalf("full chain: %v", err)
	}

	for _, tc := range []struct {
		name   string
		mutate func(c *CapabilityChain)
		detail string
	}{
		{"four delegations", func(c *CapabilityChain) {
			c.Delegations = append(c.Delegations, c.Delegations[0], c.Delegations[0], c.Delegations[0])
		}, "/delegations: maxItems"},
		{"unsigned", func(c *CapabilityChain) { c.Capability.Signature = nil }, "required: missing signature"},
		{"alg", func(c *CapabilityChain) { c.Capability.Signature.Alg = "RS256" }, "/capability/signature/alg: const"},
		{"sig padded", func(c *CapabilityChain) { c.Delegations[0].Signature.Sig = strings.Repeat("A", 84) + "==" }, "/delegations/0/signature/sig: pattern"},
		{"kid", func(c *CapabilityChain) { c.Capability.Signature.KID = "issuer" }, "/capability/signature/kid: pattern"},
		{"type swapped", func(c *CapabilityChain) { c.Capability.Type = DelegationTypeV1 }, "/capability/type: const"},
		{"scope grammar", func(c *CapabilityChain) { c.Capability.Scopes = []string{"files:*"} }, "/capability/scopes/0: pattern"},
		{"no scopes", func(c *CapabilityChain) { c.Delegations[0].ChildScope = []string{} }, "/delegations/0/child_scope: minItems"},
		{"duplicate scopes", func(c *CapabilityChain) { c.Capability.Scopes = []string{"tool:*", "tool:*"} }, "/capability/scopes: uniqueItems"},
		{"time", func(c *CapabilityChain) { c.Capability.IssuedAt = "2025-01-15 10:20" }, "/capability/issued_at: format date-time"},
		{"capability id with a colon", func(c *CapabilityChain) { c.Delegations[0].CapabilityID = "agent:x" }, "/delegations/0/capability_id: pattern"},
		{"public key", func(c *CapabilityChain) { c.Capability.SubjectPublicKey = "abc" }, "/capability/subject_public_key: pattern"},
		{"parent hash", func(c *CapabilityChain) { c.Delegations[0].ParentCapabilityHash = "sha256:x" }, "/delegations/0/parent_capability_hash: pattern"},
		{"control character in an id", func(c *CapabilityChain) { c.Delegations[0].DelegateeID = "a\nb" }, "/delegations/0/delegatee_id: pattern"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fullCapabilityChain()
			tc.mutate(&c)
			err := ValidateCapabilityChain(mustJSON(t, c))
			if err == nil || !strings.Contains(err.Error(), tc.detail) {
				t.Fatalf("want %q, got %v", tc.detail, err)
			}
		})
	}
	// Unknown members anywhere are rejected.
	for _, raw := range []string{
		`{"capability":{},"x":1}`,
		strings.Replace(string(b), `"read_only":true`, `"read_only":true,"admin":true`, 1),
		strings.Replace(string(b), `"kid":"0123456789abcdef"`, `"kid":"0123456789abcdef","x":"y"`, 1),
	} {
		if err := ValidateCapabilityChain([]byte(raw)); err == nil || !strings.Contains(err.Error(), "additionalProperties") {
			t.Errorf("unknown member accepted: %v", err)
		}
	}
}

// TestCapabilityChainAccessors checks what a chain says as a whole: the
// holder, key, scopes and expiry of its last link, and read_only from any.
func TestCapabilityChainAccessors(t *testing.T) {
	c := &CapabilityChain{Capability: Capability{CapabilityID: "c0", Subject: "a", SubjectPublicKey: "ka",
		Scopes: []string{"tool:*"}, ExpiresAt: "t0"}}
	if c.Holder() != "a" || c.HolderPublicKey() != "ka" || c.Scopes()[0] != "tool:*" || c.ExpiresAt() != "t0" || c.ReadOnly() {
		t.Fatalf("root only: %q %q %v %q %v", c.Holder(), c.HolderPublicKey(), c.Scopes(), c.ExpiresAt(), c.ReadOnly())
	}
	c.Delegations = []Delegation{
		{CapabilityID: "c1", DelegateeID: "b", DelegateePublicKey: "kb", ChildScope: []string{"tool:s:*"}, ExpiresAt: "t1",
			Constraints: &Constraints{ReadOnly: true}},
		{CapabilityID: "c2", DelegateeID: "c", DelegateePublicKey: "kc", ChildScope: []string{"tool:s:t"}, ExpiresAt: "t2"},
	}
	if c.Holder() != "c" || c.HolderPublicKey() != "kc" || c.Scopes()[0] != "tool:s:t" || c.ExpiresAt() != "t2" || !c.ReadOnly() {
		t.Fatalf("delegated: %q %q %v %q %v", c.Holder(), c.HolderPublicKey(), c.Scopes(), c.ExpiresAt(), c.ReadOnly())
	}
	if ids := c.CapabilityIDs(); len(ids) != 3 || ids[0] != "c0" || ids[2] != "c2" {
		t.Fatalf("ids %v", ids)
	}
}
