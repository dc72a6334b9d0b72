package gateway

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/jwtauth"
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
	// TokenSHA256 is the hex sha256 of the principal's static HTTP bearer
	// token (--principals); "" for the stdio principal and for principals
	// reached by JWT only.
	TokenSHA256 string
	// JWTSubject selects this principal for a verified JWT whose sub is it;
	// JWTPrincipal for one whose PrincipalClaim is it (see byJWT).
	JWTSubject, JWTPrincipal string
}

// PrincipalClaim is the JWT claim by which an issuer names the principal a
// token speaks for (a principal's jwt_principal).
const PrincipalClaim = "talos_principal"

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
		Name         string `json:"name"`
		TokenSHA256  string `json:"token_sha256"`
		JWTSubject   string `json:"jwt_subject"`
		JWTPrincipal string `json:"jwt_principal"`
		AgentID      string `json:"agent_id"`
		Capability   string `json:"capability"`
		AgentKey     string `json:"agent_key"`
	} `json:"principals"`
}

// LoadPrincipals reads the --principals file of HTTP callers; relative
// paths in it are relative to the file. A principal's agent id defaults to
// its chain's holder, else its name. Each principal is reached by a static
// bearer token (token_sha256), by a JWT (jwt_subject, jwt_principal), or
// both; each of these values selects one principal only.
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
		if tok == "" && e.JWTSubject == "" && e.JWTPrincipal == "" {
			return nil, fmt.Errorf("--principals %s: %s: token_sha256, jwt_subject or jwt_principal is required (how a caller is recognised)", path, e.Name)
		}
		if tok != "" && (len(tok) != 64 || strings.Trim(tok, "0123456789abcdef") != "") {
			return nil, fmt.Errorf("--principals %s: %s: token_sha256 must be the hex sha256 of the bearer token", path, e.Name)
		}
		p, err := LoadPrincipal(e.Name, e.AgentID, rel(e.Capability), rel(e.AgentKey))
		if err != nil {
			return nil, err
		}
		if p.AgentID == "" {
			p.AgentID = e.Name
		}
		p.TokenSHA256, p.JWTSubject, p.JWTPrincipal = tok, e.JWTSubject, e.JWTPrincipal
		out = append(out, p)
	}
	if _, err := indexPrincipals(out); err != nil {
		return nil, fmt.Errorf("--principals %s: %w", path, err)
	}
	return out, nil
}

// principalIndex finds the principal a bearer token speaks for.
type principalIndex struct {
	all       []*Principal
	bySubject map[string]*Principal
	byClaim   map[string]*Principal
}

func indexPrincipals(ps []*Principal) (*principalIndex, error) {
	ix := &principalIndex{all: ps, bySubject: map[string]*Principal{}, byClaim: map[string]*Principal{}}
	tokens := map[string]string{}
	for _, p := range ps {
		if p.TokenSHA256 != "" {
			if other, dup := tokens[p.TokenSHA256]; dup {
				return nil, fmt.Errorf("%s and %s have the same token_sha256", other, p.Name)
			}
			tokens[p.TokenSHA256] = p.Name
		}
		for _, m := range []struct {
			field, v string
			into     map[string]*Principal
		}{{"jwt_subject", p.JWTSubject, ix.bySubject}, {"jwt_principal", p.JWTPrincipal, ix.byClaim}} {
			if m.v == "" {
				continue
			}
			if other := m.into[m.v]; other != nil {
				return nil, fmt.Errorf("%s and %s have the same %s %q", other.Name, p.Name, m.field, m.v)
			}
			m.into[m.v] = p
		}
	}
	return ix, nil
}

// byStaticToken is the principal whose token_sha256 is the hash of tok,
// compared in constant time with every principal's.
func (ix *principalIndex) byStaticToken(tok string) *Principal {
	sum := sha256.Sum256([]byte(tok))
	want := []byte(hex.EncodeToString(sum[:]))
	var found *Principal
	for _, p := range ix.all {
		if p.TokenSHA256 != "" && subtle.ConstantTimeCompare([]byte(p.TokenSHA256), want) == 1 {
			found = p
		}
	}
	return found
}

// byJWT is the principal a verified token speaks for (CSP MUST 2). A token
// that carries PrincipalClaim is matched by it alone, against jwt_principal
// (the issuer named the principal: a value no principal declares is
// refused, never read as the sub); any other token is matched by its sub
// against jwt_subject. Nil: the token speaks for no principal here.
func (ix *principalIndex) byJWT(c *jwtauth.Claims) *Principal {
	if v, ok := c.Extra[PrincipalClaim]; ok {
		s, _ := v.(string)
		if s == "" {
			return nil
		}
		return ix.byClaim[s]
	}
	if c.Subject == "" {
		return nil
	}
	return ix.bySubject[c.Subject]
}
