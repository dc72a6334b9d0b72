package enforce

import (
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// ExtendChain keeps a read-only chain read-only, signs as the holder, and
// makes a chain the Authorizer accepts; it refuses to go past
// MaxDelegationDepth and leaves the chain as it was.
func TestExtendChain(t *testing.T) {
	a := capAuthorizer(t)
	chain := capBuild{depth: 1, root: func(c *schemas.Capability) {
		c.Constraints = &schemas.Constraints{ReadOnly: true}
	}}.build(t)
	d := schemas.Delegation{
		CapabilityID: "cap-d2", ChildScope: chain.Scopes(),
		IssuedAt:    capNow.Add(-30 * time.Minute).Format(schemas.TimeFormat),
		ExpiresAt:   capNow.Add(30 * time.Minute).Format(schemas.TimeFormat),
		DelegateeID: capAgent(2), DelegateePublicKey: PublicKeyString(capKey(t, 3).Public()),
	}
	if err := ExtendChain(capKey(t, 2), chain, d); err != nil {
		t.Fatal(err)
	}
	leaf := chain.Delegations[len(chain.Delegations)-1]
	if len(chain.Delegations) != 2 || !leaf.Constraints.IsReadOnly() || leaf.DelegatorID != capAgent(1) || chain.Holder() != capAgent(2) {
		t.Fatalf("extended chain: %+v", chain.Delegations)
	}
	if res := a.VerifyChain(chain, capNow, nil); len(res.Codes) != 0 || !res.ReadOnly || res.Holder != capAgent(2) {
		t.Fatalf("the extended chain does not verify: %v %v", res.Codes, res.Details)
	}

	full := capChain(t, schemas.MaxDelegationDepth)
	if err := ExtendChain(capKey(t, schemas.MaxDelegationDepth+1), full, d); err == nil || len(full.Delegations) != schemas.MaxDelegationDepth {
		t.Fatalf("past MaxDelegationDepth: %v, %d delegations", err, len(full.Delegations))
	}
}
