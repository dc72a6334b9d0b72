package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/jspub"
	"github.com/talos-audit/talos/schemas"
)

type callCmd struct {
	Server         string        `name:"server" help:"server_id of the MCP server."`
	Tool           string        `name:"tool" help:"Tool name."`
	Args           string        `name:"args" default:"{}" help:"Tool arguments as JSON, or @FILE."`
	EPID           string        `name:"ep-id" default:"talosctl" help:"Enforcement point id (decisions arrive on talos.decision.<ep-id>.>)."`
	Agent          string        `name:"agent" help:"actor.agent_id (default: the --capability chain's holder, else talosctl-agent)."`
	Session        string        `name:"session" help:"session_id (default: a new one)."`
	IdempotencyKey string        `name:"idempotency-key" help:"idempotency_key (required by write tools)."`
	ToolClass      string        `name:"tool-class" enum:",read,write" default:"" help:"Declared tool_class (informational; a mismatch is denied)."`
	RegistryDigest string        `name:"registry-digest" help:"registry_digest the enforcement point enforces with."`
	ExpectHash     []string      `name:"expect-hash" help:"expected_document_hashes entry POINTER=SHA256HEX (repeatable)."`
	Result         string        `name:"result" help:"After an allow, also send the post event with this CallToolResult JSON (or @FILE)."`
	File           string        `name:"file" type:"path" help:"Send this envelope file as-is (may be malformed: for testing)."`
	Timeout        time.Duration `name:"timeout" default:"10s" help:"How long to wait for the decision; none in time means deny (fail closed)."`
	Capability     string        `name:"capability" type:"existingfile" help:"Attach this capability chain (JSON, from talosctl cap issue|delegate) with the request_hash."`
	AgentKey       string        `name:"agent-key" type:"path" help:"Sign the envelope (sender_signature, CP-SFC) with this agent key (.key): the chain holder's."`
}

// capSigner is the CallSigner of --capability and --agent-key, or nil.
func (c *callCmd) capSigner() (*ep.CallSigner, error) {
	if c.Capability == "" {
		if c.AgentKey != "" {
			return nil, usage("--agent-key needs --capability (the key signs for the chain's holder)")
		}
		return nil, nil
	}
	s, err := ep.LoadCallSigner(c.Capability, c.AgentKey)
	if err != nil {
		return nil, usage("%v", err)
	}
	return s, nil
}

// readJSON reads a JSON flag value given inline or as @FILE.
func readJSON(flag, s string) (json.RawMessage, error) {
	text := []byte(s)
	if strings.HasPrefix(s, "@") {
		var err error
		if text, err = os.ReadFile(s[1:]); err != nil {
			return nil, usage("%s: %v", flag, err)
		}
	}
	var v json.RawMessage
	if err := json.Unmarshal(text, &v); err != nil {
		return nil, usage("%s is not JSON: %v", flag, err)
	}
	return v, nil
}

func (c *callCmd) Run(g *Globals) error {
	if c.File == "" && (c.Server == "" || c.Tool == "") {
		return usage("call needs --server and --tool (or --file ENVELOPE)")
	}
	nc, err := g.connect(schemas.NATSRoleEnforcement, c.EPID)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jspub.New(nc)
	if err != nil {
		return err
	}
	client, err := ep.NewClient(nc, js, c.EPID)
	if err != nil {
		return usage("%v", err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	if c.File != "" {
		return c.sendFile(ctx, g, client)
	}
	return c.sendCall(ctx, g, client)
}

// sendFile sends --file as it is, routed by its own phase, server_id and
// tool_call_id (or --server).
func (c *callCmd) sendFile(ctx context.Context, g *Globals, client *ep.Client) error {
	raw, err := os.ReadFile(c.File)
	if err != nil {
		return usage("%v", err)
	}
	phase, server, id := ep.EnvelopeRoute(raw)
	if c.Server != "" {
		server = c.Server
	}
	if !schemas.ValidID(server) {
		return usage("cannot route %s: give --server", c.File)
	}
	d, err := client.Send(ctx, phase, server, id, raw)
	return printDecision(g, d, err)
}

// sendCall builds, signs and sends the pre envelope of the flags' call
// and, after an allow with --result, its post event.
func (c *callCmd) sendCall(ctx context.Context, g *Globals, client *ep.Client) error {
	args, err := readJSON("--args", c.Args)
	if err != nil {
		return err
	}
	signer, err := c.capSigner()
	if err != nil {
		return err
	}
	call, err := c.envelope(args, signer)
	if err != nil {
		return err
	}
	started := time.Now()
	d, err := client.Call(ctx, call)
	if errors.Is(err, ep.ErrNoDecision) {
		err = errors.Join(err, client.RecordNoDecision(call, signer)) // the refusal is receipted too
	}
	if err != nil || d.Decision != schemas.DecisionAllow || c.Result == "" {
		return printDecision(g, d, err)
	}
	if err := printDecision(g, d, nil); err != nil {
		return err
	}
	res, err := readJSON("--result", c.Result)
	if err != nil {
		return err
	}
	post, err := ep.SignedPost(call, res, true, started, time.Now(), signer)
	if err != nil {
		return err
	}
	d, err = client.Call(ctx, post)
	return printDecision(g, d, err)
}

// envelope is the pre envelope of the flags' call, signed when a signer is
// given.
func (c *callCmd) envelope(args json.RawMessage, signer *ep.CallSigner) (*schemas.ToolCall, error) {
	hashes, err := ep.ParseExpectedHashes(c.ExpectHash)
	if err != nil {
		return nil, usage("--expect-hash %v", err)
	}
	spec := ep.CallSpec{EPID: c.EPID, Server: c.Server, Tool: c.Tool, Args: args, Agent: c.Agent, Session: c.Session,
		IdempotencyKey: c.IdempotencyKey, ToolClass: c.ToolClass, RegistryDigest: c.RegistryDigest, ExpectedHashes: hashes}
	return spec.Envelope(signer)
}

// printDecision prints a decision; a deny is not a failure, no decision is.
func printDecision(g *Globals, d *schemas.Decision, err error) error {
	if err != nil { // includes ep.ErrNoDecision: no decision is a deny, and a failure
		return failed("%v", err)
	}
	if g.JSON {
		return printJSON(os.Stdout, d)
	}
	return ep.WriteDecision(os.Stdout, d)
}
