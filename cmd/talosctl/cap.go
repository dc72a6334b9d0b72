package main

import (
	"crypto/ed25519"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// capCmd groups the capability commands (the CP- capability protocol of
// docs/REQUIREMENTS.md). They work on files and keys only: no NATS.
type capCmd struct {
	Issue    capIssueCmd    `cmd:"" help:"Issue a signed capability to an agent; writes a capability chain (no delegations)."`
	Delegate capDelegateCmd `cmd:"" help:"Delegate a narrower capability from a chain's holder to another agent; writes the longer chain."`
	Inspect  capInspectCmd  `cmd:"" help:"Print a capability chain (links, scopes, expiry, hash) and verify it; exit 1 if it is invalid."`
}

// capLifetime are the flags that set when a capability or delegation
// expires.
type capLifetime struct {
	TTL     time.Duration `name:"ttl" help:"Lifetime from now (issue: default 1h; delegate: default the parent's expiry)."`
	Expires string        `name:"expires" help:"Expiry as an RFC 3339 time (instead of --ttl)."`
}

// expiry returns expires_at for a link issued at now; def is used when
// neither flag is given.
func (l capLifetime) expiry(now, def time.Time) (time.Time, error) {
	t, err := enforce.Lifetime{TTL: l.TTL, Expires: l.Expires}.ExpiresAt(now, def)
	if err != nil {
		return t, usage("%v", err)
	}
	return t, nil
}

// loadAgentKey reads an agent's NAME.pub.
func loadAgentKey(flag, path string) (ed25519.PublicKey, error) {
	_, pub, err := verify.LoadPublicKey(path)
	if err != nil {
		return nil, usage("%s: %v", flag, err)
	}
	return pub, nil
}

// loadKey reads a signing key (.key); a failure is a usage error naming
// what.
func loadKey(what, path string) (*receipts.PrivateKey, error) {
	k, err := receipts.LoadPrivateKey(path)
	if err != nil {
		return nil, usage("%s: %v", what, err)
	}
	return k, nil
}

// writeChain writes chain as indented JSON to out, or to stdout if out is
// "", and reports a file as what.
func writeChain(g *Globals, chain *schemas.CapabilityChain, out, what string) error {
	b, err := chain.MarshalFile()
	if err != nil {
		return err
	}
	if err := writeOut(out, b); err != nil || out == "" {
		return err
	}
	f, err := enforce.DescribeChainFile(out, chain)
	if err != nil {
		return err
	}
	if g.JSON {
		return printJSON(os.Stdout, f)
	}
	return f.WriteText(os.Stdout, what)
}

// --- cap issue ---

type capIssueCmd struct {
	IssuerKey  string   `name:"issuer-key" required:"" type:"path" help:"The issuer's signing key (.key); talosd trusts its .pub via --capability-issuers."`
	Issuer     string   `name:"issuer" help:"Issuer name recorded in the capability (default: issuer-<kid>)."`
	Subject    string   `name:"subject" required:"" help:"Agent id the capability is for."`
	SubjectKey string   `name:"subject-key" required:"" type:"path" help:"The agent's public key (.pub): it signs the agent's envelopes and delegations."`
	Scope      []string `name:"scope" required:"" help:"tool:<server_id>:<tool_name>[/method:<action>][/resource:<pattern>] (tool:* and tool:<server_id>:* allowed; repeatable)."`
	ReadOnly   bool     `name:"read-only" help:"Constrain the capability to read tools (a write tool is TOOL_CLASS_MISMATCH)."`
	capLifetime
	ID  string `name:"id" help:"capability_id (default: a new UUID)."`
	Out string `name:"out" type:"path" help:"Write the chain here (default: stdout)."`
}

func (c *capIssueCmd) Run(g *Globals) error {
	key, err := loadKey("--issuer-key", c.IssuerKey)
	if err != nil {
		return err
	}
	pub, err := loadAgentKey("--subject-key", c.SubjectKey)
	if err != nil {
		return err
	}
	now := time.Now()
	exp, err := c.expiry(now, now.Add(time.Hour))
	if err != nil {
		return err
	}
	chain, err := enforce.IssueChain(key, c.Issuer, enforce.Grant{ID: c.ID, To: c.Subject, ToKey: pub, Scopes: c.Scope,
		ReadOnly: c.ReadOnly, IssuedAt: now, ExpiresAt: exp})
	if err != nil {
		return usage("%v", err)
	}
	return writeChain(g, chain, c.Out, "issued")
}

// --- cap delegate ---

type capDelegateCmd struct {
	From      string   `name:"from" required:"" type:"existingfile" help:"The capability chain to extend (JSON)."`
	HolderKey string   `name:"holder-key" required:"" type:"path" help:"The chain holder's signing key (.key)."`
	To        string   `name:"to" required:"" help:"Agent id of the delegatee."`
	ToKey     string   `name:"to-key" required:"" type:"path" help:"The delegatee's public key (.pub)."`
	Scope     []string `name:"scope" required:"" help:"Child scopes, each within the holder's scopes (repeatable)."`
	ReadOnly  bool     `name:"read-only" help:"Add the read_only constraint (kept automatically if the parent has it)."`
	capLifetime
	ID  string `name:"id" help:"capability_id of the delegation (default: a new UUID)."`
	Out string `name:"out" type:"path" help:"Write the new chain here (default: stdout)."`
}

func (c *capDelegateCmd) Run(g *Globals) error {
	chain, err := schemas.ReadCapabilityChainFile(c.From)
	if err != nil {
		return usage("--from: %v", err)
	}
	if len(chain.Delegations) >= schemas.MaxDelegationDepth {
		return failed("the chain already has %d delegations (MAX_DELEGATION_DEPTH)", schemas.MaxDelegationDepth)
	}
	key, err := loadKey("--holder-key", c.HolderKey)
	if err != nil {
		return err
	}
	pub, err := loadAgentKey("--to-key", c.ToKey)
	if err != nil {
		return err
	}
	def, err := enforce.ChainExpiresAt(chain)
	if err != nil {
		return usage("--from: the last link's expires_at is not an RFC 3339 time")
	}
	now := time.Now()
	exp, err := c.expiry(now, def)
	if err != nil {
		return err
	}
	g2 := enforce.Grant{ID: c.ID, To: c.To, ToKey: pub, Scopes: c.Scope, ReadOnly: c.ReadOnly, IssuedAt: now, ExpiresAt: exp}
	if err := enforce.DelegateGrant(key, chain, g2); err != nil {
		return failed("%v", err)
	}
	return writeChain(g, chain, c.Out, "delegated")
}

// --- cap inspect ---

type capInspectCmd struct {
	Chain    string   `arg:"" type:"existingfile" help:"Capability chain file (JSON)."`
	Issuers  []string `name:"issuers" type:"path" help:"Trusted issuer public keys (.pub files or directories); without them no root signature is trusted."`
	Revoked  []string `name:"revoked" help:"Treat this capability id or agent:<id> as revoked (repeatable; offline check)."`
	At       string   `name:"at" help:"Check validity at this RFC 3339 time instead of now."`
	Server   string   `name:"server" help:"Also check that the chain's scopes cover a call to this server_id (with --tool)."`
	Tool     string   `name:"tool" help:"Tool name for the scope check."`
	Method   string   `name:"method" help:"Action name for the scope check (action-based tools)."`
	Resource *string  `name:"resource" help:"Resource (the argument at the tool's resource_pointer) for the scope check."`
}

func (c *capInspectCmd) Run(g *Globals) error {
	q, err := enforce.NewScopeQuery(c.Server, c.Tool, c.Method, c.Resource)
	if err != nil {
		return usage("%v", err)
	}
	now := time.Now()
	if c.At != "" {
		if now, err = time.Parse(time.RFC3339Nano, c.At); err != nil {
			return usage("--at: not an RFC 3339 time")
		}
	}
	issuers, err := verify.LoadKeys(c.Issuers...)
	if err != nil {
		return usage("--issuers: %v", err)
	}
	authz, err := enforce.NewAuthorizer(enforce.CapabilityConfig{Issuers: issuers})
	if err != nil {
		return usage("%v", err)
	}
	raw, err := os.ReadFile(c.Chain)
	if err != nil {
		return usage("%v", err)
	}
	in := authz.InspectChain(raw, now, func(s string) bool { return slices.Contains(c.Revoked, s) }, q)
	if len(issuers) == 0 {
		in.Result.Details = append(in.Result.Details, "no --issuers given: no issuer is trusted")
	}
	if g.JSON {
		printJSON(os.Stdout, in.Report(c.Chain, q, now))
	} else if err := in.WriteText(os.Stdout, c.Chain, q, now); err != nil {
		return err
	}
	if !in.Valid() {
		return exitError{1, fmt.Errorf("capability chain is invalid: %s", strings.Join(in.Result.Codes, ", "))}
	}
	return nil
}
