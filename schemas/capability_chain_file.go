package schemas

import (
	"encoding/json"
	"os"
)

// Capability chain files: what `talosctl cap issue` and `cap delegate`
// write and `cap delegate --from` reads back.

// ReadCapabilityChainFile reads the chain file at path strictly: the bytes
// must match the capability chain schema (ValidateCapabilityChain: unknown
// members are rejected) before they are decoded.
func ReadCapabilityChainFile(path string) (*CapabilityChain, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := ValidateCapabilityChain(raw); err != nil {
		return nil, err
	}
	var c CapabilityChain
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// MarshalFile is c as a chain file holds it: indented JSON and a newline.
func (c *CapabilityChain) MarshalFile() ([]byte, error) {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
