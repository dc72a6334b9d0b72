package schemas

// What a capability chain says as a whole, read from its links as they
// are. These say nothing about whether the chain is valid: only
// enforce.Authorizer checks signatures, containment and expiry.

// IsReadOnly reports whether c constrains to read tools (false for nil).
func (c *Constraints) IsReadOnly() bool { return c != nil && c.ReadOnly }

// Holder is the agent the chain was last handed to: the last delegation's
// delegatee, or the root's subject.
func (c *CapabilityChain) Holder() string {
	if n := len(c.Delegations); n > 0 {
		return c.Delegations[n-1].DelegateeID
	}
	return c.Capability.Subject
}

// HolderPublicKey is the holder's public key in wire form.
func (c *CapabilityChain) HolderPublicKey() string {
	if n := len(c.Delegations); n > 0 {
		return c.Delegations[n-1].DelegateePublicKey
	}
	return c.Capability.SubjectPublicKey
}

// Scopes are the chain's effective scopes: the last link's (each
// delegation may only narrow its parent's).
func (c *CapabilityChain) Scopes() []string {
	if n := len(c.Delegations); n > 0 {
		return c.Delegations[n-1].ChildScope
	}
	return c.Capability.Scopes
}

// ExpiresAt is the last link's expires_at.
func (c *CapabilityChain) ExpiresAt() string {
	if n := len(c.Delegations); n > 0 {
		return c.Delegations[n-1].ExpiresAt
	}
	return c.Capability.ExpiresAt
}

// ReadOnly reports whether any link carries the read_only constraint: a
// delegation cannot drop its parent's, so the chain is read-only from the
// first link that says so.
func (c *CapabilityChain) ReadOnly() bool {
	if c.Capability.Constraints.IsReadOnly() {
		return true
	}
	for i := range c.Delegations {
		if c.Delegations[i].Constraints.IsReadOnly() {
			return true
		}
	}
	return false
}

// CapabilityIDs are the links' capability ids, root first.
func (c *CapabilityChain) CapabilityIDs() []string {
	ids := make([]string, 0, 1+len(c.Delegations))
	ids = append(ids, c.Capability.CapabilityID)
	for i := range c.Delegations {
		ids = append(ids, c.Delegations[i].CapabilityID)
	}
	return ids
}
