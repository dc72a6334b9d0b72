package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
)

// Principal is who a downstream MCP session speaks for: the agent, its
// capability chain and what that chain lets it see (CSP MUST 3).
type Principal struct {
	Name    string
	AgentID string
	Signer  *ep.CallSigner // nil: calls carry no capability
	// Viewer is what discovery knows of the chain: its holder's effective
	// scopes (nil without a capability) and its narrowing.
	Viewer enforce.Viewer
	// TokenSHA256 is the hex sha256 of the principal's HTTP bearer token
	// (--principals); "" for the stdio principal.
	TokenSHA256 string
}

// LoadPrincipal reads a capability chain and the holder's key. Both are
// optional; a key needs a chain. AgentID defaults to the chain's holder.
func LoadPrincipal(name, agentID, capFile, keyFile string) (*Principal, error) {
	p := &Principal{Name: name, AgentID: agentID}
	if capFile == "" {
		if keyFile != "" {
			return nil, fmt.Errorf("%s: an agent key needs a capability (the key signs for the chain's holder)", name)
		}
		return p, nil
	}
	var err error
	if p.Signer, err = ep.LoadCallSigner(capFile, keyFile); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if p.Viewer, err = enforce.ViewerOf(p.Signer.Chain()); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if p.AgentID == "" {
		p.AgentID = p.Signer.Holder()
	}
	return p, nil
}

// principalsFile is the JSON of --principals.
type principalsFile struct {
	Principals []struct {
		Name        string `json:"name"`
		TokenSHA256 string `json:"token_sha256"`
		AgentID     string `json:"agent_id"`
		Capability  string `json:"capability"`
		AgentKey    string `json:"agent_key"`
	} `json:"principals"`
}

// LoadPrincipals reads the --principals file of HTTP callers; relative
// paths in it are relative to the file. A principal's agent id defaults to
// its chain's holder, else its name.
func LoadPrincipals(path string) ([]*Principal, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f principalsFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("--principals %s: %w", path, err)
	}
	if len(f.Principals) == 0 {
		return nil, fmt.Errorf("--principals %s: no principals", path)
	}
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(path), p)
	}
	var out []*Principal
	names := map[string]bool{}
	for i, e := range f.Principals {
		if e.Name == "" || names[e.Name] {
			return nil, fmt.Errorf("--principals %s: entry %d: a unique name is required", path, i)
		}
		names[e.Name] = true
		tok := strings.ToLower(e.TokenSHA256)
		if len(tok) != 64 || strings.Trim(tok, "0123456789abcdef") != "" {
			return nil, fmt.Errorf("--principals %s: %s: token_sha256 must be the hex sha256 of the bearer token", path, e.Name)
		}
		p, err := LoadPrincipal(e.Name, e.AgentID, rel(e.Capability), rel(e.AgentKey))
		if err != nil {
			return nil, err
		}
		if p.AgentID == "" {
			p.AgentID = e.Name
		}
		p.TokenSHA256 = tok
		out = append(out, p)
	}
	return out, nil
}
