package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// ctlFlags are shared by every control command: who signs and who is named
// as the actor in the control receipt.
type ctlFlags struct {
	signerFlags
	Timeout time.Duration `name:"timeout" default:"30s" help:"How long to wait for the control service, retrying the same command (and, with --wait, for every live worker): 30 s outlasts a NATS cluster's leader election."`
}

// signerFlags name the responder key that signs control commands.
type signerFlags struct {
	ResponderKey string `name:"responder-key" type:"path" help:"Responder signing key (.key) talosd trusts (default: talos-data/keys/responder.key when it exists)."`
	Actor        string `name:"actor" help:"Who is acting, recorded in the control receipt (default: USER@HOST)."`
}

// waitFlags are for commands that change enforcement state.
type waitFlags struct {
	Wait bool `name:"wait" help:"Return only when every live worker has applied the change; print how long that took."`
}

func (f *ctlFlags) actor() string {
	if f.Actor != "" {
		return f.Actor
	}
	return control.LocalActor()
}

// responderKeyDefault is where `talosd dev` writes the responder key.
const responderKeyDefault = "talos-data/keys/responder.key"

// key loads --responder-key, by default the one `talosd dev` writes.
func (f *ctlFlags) key() (*receipts.PrivateKey, error) {
	if f.ResponderKey != "" {
		return loadKey("responder key", f.ResponderKey)
	}
	if _, err := os.Stat(responderKeyDefault); err != nil {
		return nil, usage("control commands are signed: pass --responder-key FILE (a key talosd trusts via --responder-keys); there is no ./%s here, where talosd dev writes its responder key: run from the directory that holds talos-data, or pass --responder-key <data dir>/keys/responder.key", responderKeyDefault)
	}
	return loadKey("responder key", responderKeyDefault)
}

// open connects a control client; done disconnects it.
func (f *ctlFlags) open(g *Globals) (client *control.ControlClient, done func(), err error) {
	key, err := f.key()
	if err != nil {
		return nil, nil, err
	}
	nc, err := g.connect("responder", "")
	if err != nil {
		return nil, nil, err
	}
	return control.NewControlClient(nc, key, f.actor()), nc.Close, nil
}

// send sends verb's command, filled by fill, and with wait waits for every
// live worker to apply it. With --json it prints a refusal's reply.
func (f *ctlFlags) send(g *Globals, verb string, wait bool, fill func(*schemas.ControlCommand)) (*schemas.ControlReply, *control.Propagation, error) {
	client, done, err := f.open(g)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	cmd := client.NewCommand(verb)
	if fill != nil {
		fill(cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.Timeout)
	defer cancel()
	var within time.Duration
	if wait {
		within = f.Timeout
	}
	rep, prop, err := client.Send(ctx, cmd, within)
	var refused *control.RefusedError
	switch {
	case rep == nil:
		return nil, nil, failed("%s: %v", verb, err)
	case errors.As(err, &refused) && g.JSON:
		_ = printJSON(os.Stdout, rep)
	}
	if err != nil {
		err = failed("%v", err)
	}
	return rep, prop, err
}

// mutate sends one signed mutating command, filled by fill, and reports it
// as what (waiting for every live worker with wait).
func mutate(g *Globals, f *ctlFlags, wait bool, verb, what string, fill func(*schemas.ControlCommand)) error {
	rep, prop, err := f.send(g, verb, wait, fill)
	if rep == nil || !rep.OK {
		return err
	}
	_ = control.WriteResult(os.Stdout, g.JSON, verb, what, rep, prop)
	return err
}

// read sends a read verb and prints its reply: as JSON with --json, else
// as control.WriteReply renders it (which also fails a reply without what
// the verb reads).
func (f *ctlFlags) read(g *Globals, verb string, fill func(*schemas.ControlCommand)) error {
	rep, _, err := f.send(g, verb, false, fill)
	if err != nil {
		return err
	}
	w := io.Writer(os.Stdout)
	if g.JSON {
		_ = printJSON(os.Stdout, rep)
		w = io.Discard
	}
	if err := control.WriteReply(w, verb, rep); err != nil {
		return failed("%v", err)
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// --- killswitch ---

type killswitchCmd struct {
	Set   killswitchSetCmd   `cmd:"" help:"Stop calls in a scope on every worker: global, server:<id>, tool:<server_id>/<tool_name>, agent:<agent_id>, session:<id> (deny KILL_SWITCH); or only network_outbound tools: egress:global, egress:agent:<agent_id>, egress:session:<id> (deny NETWORK_OUTBOUND_BLOCKED)."`
	Clear killswitchClearCmd `cmd:"" help:"Lift a kill switch."`
	List  killswitchListCmd  `cmd:"" help:"List active kill switches."`
}

// scopeArgs are the arguments of killswitch set and clear.
type scopeArgs struct {
	ctlFlags
	waitFlags
	Scope  string `arg:"" help:"global | server:<id> | tool:<server_id>/<tool_name> | agent:<agent_id> | session:<id> | egress:global | egress:agent:<agent_id> | egress:session:<id> (to clear: as it was set)"`
	Reason string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (a *scopeArgs) send(g *Globals, verb string) error {
	if _, _, ok := schemas.ParseScope(a.Scope); !ok {
		return usage("scope %q: want global, server:<id>, tool:<server_id>/<tool_name>, agent:<agent_id>, session:<id>, or egress:global, egress:agent:<agent_id>, egress:session:<id>", a.Scope)
	}
	return mutate(g, &a.ctlFlags, a.Wait, verb, verb+" "+a.Scope, func(cmd *schemas.ControlCommand) {
		cmd.Scope, cmd.Reason = a.Scope, a.Reason
	})
}

type killswitchSetCmd struct{ scopeArgs }

func (c *killswitchSetCmd) Run(g *Globals) error { return c.send(g, schemas.VerbKillSwitchSet) }

type killswitchClearCmd struct{ scopeArgs }

func (c *killswitchClearCmd) Run(g *Globals) error { return c.send(g, schemas.VerbKillSwitchClear) }

type killswitchListCmd struct{ ctlFlags }

func (c *killswitchListCmd) Run(g *Globals) error { return c.read(g, schemas.VerbKillSwitchList, nil) }

// --- quarantine ---

type quarantineCmd struct {
	Set   quarantineSetCmd   `cmd:"" help:"Quarantine a session on every worker (deny SESSION_QUARANTINED)."`
	Clear quarantineClearCmd `cmd:"" help:"Release a quarantined session."`
	List  quarantineListCmd  `cmd:"" help:"List quarantined sessions."`
}

// sessionArgs are the arguments of quarantine set and clear.
type sessionArgs struct {
	ctlFlags
	waitFlags
	Session string `arg:"" help:"session_id"`
	Reason  string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (a *sessionArgs) send(g *Globals, verb string) error {
	return mutate(g, &a.ctlFlags, a.Wait, verb, verb+" "+a.Session, func(cmd *schemas.ControlCommand) {
		cmd.SessionID, cmd.Reason = a.Session, a.Reason
	})
}

type quarantineSetCmd struct{ sessionArgs }

func (c *quarantineSetCmd) Run(g *Globals) error { return c.send(g, schemas.VerbQuarantineSet) }

type quarantineClearCmd struct{ sessionArgs }

func (c *quarantineClearCmd) Run(g *Globals) error { return c.send(g, schemas.VerbQuarantineClear) }

type quarantineListCmd struct{ ctlFlags }

func (c *quarantineListCmd) Run(g *Globals) error { return c.read(g, schemas.VerbQuarantineList, nil) }

// --- revoke ---

type revokeCmd struct {
	ctlFlags
	waitFlags
	Target string `arg:"" help:"A capability id, or agent:<agent_id>."`
	Reason string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (c *revokeCmd) Run(g *Globals) error {
	return mutate(g, &c.ctlFlags, c.Wait, schemas.VerbRevoke, "revoke "+c.Target, func(cmd *schemas.ControlCommand) {
		cmd.Target, cmd.Reason = c.Target, c.Reason
	})
}

// --- registry ---

type registryCmd struct {
	Publish registryPublishCmd `cmd:"" help:"Validate and store a registry bundle (a manifest file or a directory of *.json manifests); prints its digest. Does not pin it."`
	Pin     registryPinCmd     `cmd:"" help:"Pin a published bundle by digest: every worker switches to it atomically."`
	Show    registryShowCmd    `cmd:"" help:"Show the pinned digest and the published bundles."`
	Lint    registryLintCmd    `cmd:"" help:"Compare a server's manifest with the live tools/list of the upstream MCP server, asked with the client capabilities the gateway declares (CM-COMPLETE): exit 1 when tools or actions are missing from the registry."`
}

type registryPublishCmd struct {
	ctlFlags
	Path   string `arg:"" type:"path" help:"Manifest file, or directory of *.json manifests."`
	Reason string `name:"reason" help:"Why (recorded in the signed control receipt)."`
}

func (c *registryPublishCmd) Run(g *Globals) error {
	files, err := enforce.ReadManifestFiles(c.Path)
	if err != nil {
		return usage("registry: %v", err)
	}
	manifests := make([]json.RawMessage, len(files))
	for i, f := range files {
		manifests[i] = f.Raw
	}
	reg, err := enforce.LoadRegistry(c.Path) // validate here first: errors name the file
	if err != nil {
		return failed("%v", err)
	}
	err = mutate(g, &c.ctlFlags, false, schemas.VerbRegistryPublish, "registry publish "+reg.Digest(), func(cmd *schemas.ControlCommand) {
		cmd.Manifests, cmd.Reason = manifests, c.Reason
	})
	if err != nil {
		return err
	}
	if !g.JSON {
		fmt.Printf("published %s (%d servers); pin it with: talosctl registry pin %s\n", reg.Digest(), len(reg.Manifests()), reg.Digest())
	}
	return nil
}

type registryPinCmd struct {
	ctlFlags
	waitFlags
	Digest string `arg:"" help:"sha256:<hex> of a published bundle."`
	Reason string `name:"reason" help:"Why (recorded in the signed control receipt)."`
}

func (c *registryPinCmd) Run(g *Globals) error {
	return mutate(g, &c.ctlFlags, c.Wait, schemas.VerbRegistryPin, "registry pin "+c.Digest, func(cmd *schemas.ControlCommand) {
		cmd.Digest, cmd.Reason = c.Digest, c.Reason
	})
}

type registryShowCmd struct{ ctlFlags }

func (c *registryShowCmd) Run(g *Globals) error { return c.read(g, schemas.VerbRegistryShow, nil) }

// --- replay ---

type replayCmd struct {
	Stats replayStatsCmd `cmd:"" help:"How many correlation ids the shared replay store remembers, and for how long."`
	Check replayCheckCmd `cmd:"" help:"Whether a correlation id was used in a session, and by which call."`
	Flush replayFlushCmd `cmd:"" help:"Forget the correlation ids of one session (or of every session): they may be used again."`
}

type replayStatsCmd struct{ ctlFlags }

func (c *replayStatsCmd) Run(g *Globals) error { return c.read(g, schemas.VerbReplayStats, nil) }

type replayCheckCmd struct {
	ctlFlags
	Session       string `arg:"" help:"session_id"`
	CorrelationID string `arg:"" help:"correlation_id"`
}

func (c *replayCheckCmd) Run(g *Globals) error {
	return c.read(g, schemas.VerbReplayCheck, func(cmd *schemas.ControlCommand) {
		cmd.SessionID, cmd.CorrelationID = c.Session, c.CorrelationID
	})
}

type replayFlushCmd struct {
	ctlFlags
	waitFlags
	Session string `name:"session" help:"Only this session (default: every session)."`
	Reason  string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (c *replayFlushCmd) Run(g *Globals) error {
	what := "replay flush (every session)"
	if c.Session != "" {
		what = "replay flush session " + c.Session
	}
	return mutate(g, &c.ctlFlags, c.Wait, schemas.VerbReplayFlush, what, func(cmd *schemas.ControlCommand) {
		cmd.SessionID, cmd.Reason = c.Session, c.Reason
	})
}

// --- status ---

type statusCmd struct{ ctlFlags }

func (c *statusCmd) Run(g *Globals) error { return c.read(g, schemas.VerbStatus, nil) }

// --- approve / reject ---

// approveCmd releases a call parked for human approval (decision
// require_approval): the control service records a signed approve event,
// the enforcement point that parked the call runs it.
type approveCmd struct {
	ctlFlags
	waitFlags
	ToolCallID string `arg:"" name:"tool_call_id" help:"The tool_call_id of the call awaiting approval (from its decision or the gateway's log); EP_ID:TOOL_CALL_ID when several enforcement points parked that id."`
	Reason     string `name:"reason" help:"Why (recorded in the signed control receipt)."`
}

func (c *approveCmd) Run(g *Globals) error {
	return approvalCmd(g, &c.ctlFlags, c.Wait, schemas.VerbApprove, c.ToolCallID, c.Reason)
}

// rejectCmd refuses a call parked for human approval: the enforcement
// point denies it (APPROVAL_REJECTED).
type rejectCmd struct {
	ctlFlags
	waitFlags
	ToolCallID string `arg:"" name:"tool_call_id" help:"The tool_call_id of the call awaiting approval, or EP_ID:TOOL_CALL_ID."`
	Reason     string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (c *rejectCmd) Run(g *Globals) error {
	return approvalCmd(g, &c.ctlFlags, c.Wait, schemas.VerbReject, c.ToolCallID, c.Reason)
}

// approvalCmd sends approve or reject for toolCallID (or EP_ID:TOOL_CALL_ID). A
// call not awaiting approval or already resolved, or an id several enforcement
// points parked (name one), is refused by the control service: exit 1.
func approvalCmd(g *Globals, f *ctlFlags, wait bool, verb, toolCallID, reason string) error {
	if _, _, ok := schemas.ParseApprovalTarget(toolCallID); !ok {
		return usage("%s: %q is not a tool_call_id (a UUID) or EP_ID:TOOL_CALL_ID", verb, toolCallID)
	}
	return mutate(g, f, wait, verb, verb+" "+toolCallID, func(cmd *schemas.ControlCommand) {
		cmd.Target, cmd.Reason = toolCallID, reason
	})
}
