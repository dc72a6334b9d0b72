package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
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
	Timeout time.Duration `name:"timeout" default:"10s" help:"How long to wait for the control service (and, with --wait, for every live worker)."`
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

func (f *ctlFlags) key() (*receipts.PrivateKey, error) {
	path := f.ResponderKey
	if path == "" {
		if _, err := os.Stat(responderKeyDefault); err != nil {
			return nil, usage("control commands are signed: pass --responder-key FILE (a key talosd trusts via --responder-keys)")
		}
		path = responderKeyDefault
	}
	k, err := receipts.LoadPrivateKey(path)
	if err != nil {
		return nil, usage("responder key: %v", err)
	}
	return k, nil
}

// ctlSession is one connected control client.
type ctlSession struct {
	client *control.ControlClient
	close  func()
	f      *ctlFlags
	g      *Globals
}

func (f *ctlFlags) open(g *Globals) (*ctlSession, error) {
	key, err := f.key()
	if err != nil {
		return nil, err
	}
	nc, err := g.connect("responder", "")
	if err != nil {
		return nil, err
	}
	return &ctlSession{client: control.NewControlClient(nc, key, f.actor()), close: nc.Close, f: f, g: g}, nil
}

// do sends cmd and, with wait, waits for every live worker to apply it. It
// prints the outcome and returns an exit error for a refusal.
func (s *ctlSession) do(cmd *schemas.ControlCommand, wait bool, what string) (*schemas.ControlReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.f.Timeout)
	defer cancel()
	var (
		rep  *schemas.ControlReply
		prop *control.Propagation
		err  error
	)
	if wait {
		rep, prop, err = s.client.DoAndWait(ctx, cmd, s.f.Timeout)
	} else {
		rep, err = s.client.Do(ctx, cmd)
	}
	if err != nil {
		return nil, failed("%s: %v", cmd.Verb, err)
	}
	if !rep.OK {
		if s.g.JSON {
			printJSON(os.Stdout, rep)
		}
		return rep, failed("%s refused: %s (%s)", cmd.Verb, rep.Error, rep.Code)
	}
	if s.g.JSON {
		out := map[string]any{"reply": rep}
		if prop != nil {
			out["propagation"] = prop.Summary()
		}
		printJSON(os.Stdout, out)
	} else if schemas.MutatingVerbs[cmd.Verb] {
		fmt.Printf("%s: ok (control seq %d, receipt %s)\n", what, rep.Seq, rep.ReceiptID)
		if prop != nil {
			_ = prop.WriteText(os.Stdout)
		}
	}
	if prop != nil && len(prop.Missing) > 0 {
		return rep, failed("%d worker(s) did not confirm seq %d in time: %s", len(prop.Missing), rep.Seq, strings.Join(prop.Missing, ", "))
	}
	return rep, nil
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// --- killswitch ---

type killswitchCmd struct {
	Set   killswitchSetCmd   `cmd:"" help:"Stop calls in a scope on every worker: global, server:<id>, tool:<server_id>/<tool_name>, agent:<agent_id>, session:<id> (deny KILL_SWITCH); or only network_outbound tools: egress:global, egress:agent:<agent_id>, egress:session:<id> (deny NETWORK_OUTBOUND_BLOCKED)."`
	Clear killswitchClearCmd `cmd:"" help:"Lift a kill switch."`
	List  killswitchListCmd  `cmd:"" help:"List active kill switches."`
}

type killswitchSetCmd struct {
	ctlFlags
	waitFlags
	Scope  string `arg:"" help:"global | server:<id> | tool:<server_id>/<tool_name> | agent:<agent_id> | session:<id> | egress:global | egress:agent:<agent_id> | egress:session:<id>"`
	Reason string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (c *killswitchSetCmd) Run(g *Globals) error {
	return scopeCmd(g, &c.ctlFlags, c.Wait, schemas.VerbKillSwitchSet, c.Scope, c.Reason)
}

type killswitchClearCmd struct {
	ctlFlags
	waitFlags
	Scope  string `arg:"" help:"The scope to clear, as it was set."`
	Reason string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (c *killswitchClearCmd) Run(g *Globals) error {
	return scopeCmd(g, &c.ctlFlags, c.Wait, schemas.VerbKillSwitchClear, c.Scope, c.Reason)
}

func scopeCmd(g *Globals, f *ctlFlags, wait bool, verb, scope, reason string) error {
	if _, _, ok := schemas.ParseScope(scope); !ok {
		return usage("scope %q: want global, server:<id>, tool:<server_id>/<tool_name>, agent:<agent_id>, session:<id>, or egress:global, egress:agent:<agent_id>, egress:session:<id>", scope)
	}
	return mutate(g, f, wait, verb, verb+" "+scope, func(cmd *schemas.ControlCommand) {
		cmd.Scope, cmd.Reason = scope, reason
	})
}

// mutate sends one signed mutating command, filled by fill, and reports it
// as what (waiting for every live worker with wait).
func mutate(g *Globals, f *ctlFlags, wait bool, verb, what string, fill func(*schemas.ControlCommand)) error {
	s, err := f.open(g)
	if err != nil {
		return err
	}
	defer s.close()
	cmd := s.client.NewCommand(verb)
	fill(cmd)
	_, err = s.do(cmd, wait, what)
	return err
}

type killswitchListCmd struct{ ctlFlags }

func (c *killswitchListCmd) Run(g *Globals) error {
	v, err := readState(g, &c.ctlFlags, schemas.VerbKillSwitchList)
	if err != nil || g.JSON {
		return err
	}
	return control.WriteStateEntries(os.Stdout, "SCOPE", v.KillSwitches, v.Seq)
}

// --- quarantine ---

type quarantineCmd struct {
	Set   quarantineSetCmd   `cmd:"" help:"Quarantine a session on every worker (deny SESSION_QUARANTINED)."`
	Clear quarantineClearCmd `cmd:"" help:"Release a quarantined session."`
	List  quarantineListCmd  `cmd:"" help:"List quarantined sessions."`
}

type quarantineSetCmd struct {
	ctlFlags
	waitFlags
	Session string `arg:"" help:"session_id"`
	Reason  string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (c *quarantineSetCmd) Run(g *Globals) error {
	return sessionCmd(g, &c.ctlFlags, c.Wait, schemas.VerbQuarantineSet, c.Session, c.Reason)
}

type quarantineClearCmd struct {
	ctlFlags
	waitFlags
	Session string `arg:"" help:"session_id"`
	Reason  string `name:"reason" required:"" help:"Why (recorded in the signed control receipt)."`
}

func (c *quarantineClearCmd) Run(g *Globals) error {
	return sessionCmd(g, &c.ctlFlags, c.Wait, schemas.VerbQuarantineClear, c.Session, c.Reason)
}

func sessionCmd(g *Globals, f *ctlFlags, wait bool, verb, session, reason string) error {
	return mutate(g, f, wait, verb, verb+" "+session, func(cmd *schemas.ControlCommand) {
		cmd.SessionID, cmd.Reason = session, reason
	})
}

type quarantineListCmd struct{ ctlFlags }

func (c *quarantineListCmd) Run(g *Globals) error {
	v, err := readState(g, &c.ctlFlags, schemas.VerbQuarantineList)
	if err != nil || g.JSON {
		return err
	}
	return control.WriteStateEntries(os.Stdout, "SESSION", v.Quarantines, v.Seq)
}

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
	Lint    registryLintCmd    `cmd:"" help:"Compare a server's manifest with the live tools/list of the upstream MCP server (seed 004 completeness): exit 1 when tools or actions are missing from the registry."`
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
	s, err := c.open(g)
	if err != nil {
		return err
	}
	defer s.close()
	cmd := s.client.NewCommand(schemas.VerbRegistryPublish)
	cmd.Manifests, cmd.Reason = manifests, c.Reason
	if _, err := s.do(cmd, false, "registry publish "+reg.Digest()); err != nil {
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

func (c *registryShowCmd) Run(g *Globals) error {
	v, err := readState(g, &c.ctlFlags, schemas.VerbRegistryShow)
	if err != nil || g.JSON {
		return err
	}
	return control.WriteRegistryView(os.Stdout, v.Registry)
}

// --- replay ---

type replayCmd struct {
	Stats replayStatsCmd `cmd:"" help:"How many correlation ids the shared replay store remembers, and for how long."`
	Check replayCheckCmd `cmd:"" help:"Whether a correlation id was used in a session, and by which call."`
	Flush replayFlushCmd `cmd:"" help:"Forget the correlation ids of one session (or of every session): they may be used again."`
}

type replayStatsCmd struct{ ctlFlags }

func (c *replayStatsCmd) Run(g *Globals) error {
	rep, err := readReply(g, &c.ctlFlags, schemas.VerbReplayStats, nil)
	if err != nil || g.JSON {
		return err
	}
	if rep.Replay == nil {
		return failed("replay.stats: empty reply")
	}
	fmt.Printf("correlation ids remembered: %d (%d bytes), window %s\n", rep.Replay.Keys, rep.Replay.Bytes, rep.Replay.Window)
	return nil
}

type replayCheckCmd struct {
	ctlFlags
	Session       string `arg:"" help:"session_id"`
	CorrelationID string `arg:"" help:"correlation_id"`
}

func (c *replayCheckCmd) Run(g *Globals) error {
	rep, err := readReply(g, &c.ctlFlags, schemas.VerbReplayCheck, func(cmd *schemas.ControlCommand) {
		cmd.SessionID, cmd.CorrelationID = c.Session, c.CorrelationID
	})
	if err != nil || g.JSON {
		return err
	}
	if rep.Replay == nil || rep.Replay.Seen == nil || !*rep.Replay.Seen {
		fmt.Println("not seen: a call with this correlation id would not be a replay")
		return nil
	}
	fmt.Printf("seen: used by tool call %s; another call with it is denied REPLAY\n", rep.Replay.ToolCall)
	return nil
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

func (c *statusCmd) Run(g *Globals) error {
	rep, err := readReply(g, &c.ctlFlags, schemas.VerbStatus, nil)
	if err != nil || g.JSON {
		return err
	}
	return control.WriteWorkerStatus(os.Stdout, rep.Status)
}

// readReply sends a read verb and returns its reply (printing it with --json).
func readReply(g *Globals, f *ctlFlags, verb string, fill func(*schemas.ControlCommand)) (*schemas.ControlReply, error) {
	s, err := f.open(g)
	if err != nil {
		return nil, err
	}
	defer s.close()
	cmd := s.client.NewCommand(verb)
	if fill != nil {
		fill(cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.Timeout)
	defer cancel()
	rep, err := s.client.Do(ctx, cmd)
	if err != nil {
		return nil, failed("%s: %v", verb, err)
	}
	if g.JSON {
		printJSON(os.Stdout, rep)
	}
	if !rep.OK {
		return rep, failed("%s refused: %s (%s)", verb, rep.Error, rep.Code)
	}
	return rep, nil
}

func readState(g *Globals, f *ctlFlags, verb string) (*schemas.IncidentView, error) {
	rep, err := readReply(g, f, verb, nil)
	if err != nil {
		return nil, err
	}
	if rep.State == nil {
		return nil, failed("%s: reply without state", verb)
	}
	return rep.State, nil
}
