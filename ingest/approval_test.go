package ingest_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// approvalManifest is a community server: its tools need a human
// approval (trust_level community, no requires_approval override).
const approvalManifest = `{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "community",
 "tools": [{"tool_name": "search", "tool_class": "read", "is_document_op": false, "trust_level": "community", "network_outbound": true}]}`

// approvalPlane is one talosd's worth of roles on a real NATS: an enforce
// worker (decider with the shared call ledger and the flight recorder) and
// the control service whose precheck is talosd's: the worker's State, then
// the ledger (enforce.State.AwaitsApproval).
type approvalPlane struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	client *ep.Client
	ctl    *control.ControlClient
	fol    *control.ControlFollower
	keys   verify.KeySet
}

func newApprovalPlane(t *testing.T) *approvalPlane {
	t.Helper()
	url := testenv.NATSForTest(t).URL()
	nc, js := testenv.ConnectJS(t, url)
	ctx, cancel := context.WithCancel(context.Background())
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, n := range []string{"files.json", "github.json"} {
		b, err := os.ReadFile(filepath.Join(demoRegistry, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "community.json"), []byte(approvalManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := enforce.LoadRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, keys := newSigner(t)
	responder, responders := newSigner(t)

	ledger := newLedger(t, js)
	red, err := redact.New(redact.Config{Key: []byte(strings.Repeat("k", 32)), KeyID: "test"})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := enforce.NewDecider(mustEngine(t, reg), enforce.DeciderOptions{Ledger: ledger, Redactor: red})
	if err != nil {
		t.Fatal(err)
	}
	wnc, wjs := testenv.ConnectJS(t, url)
	enf, err := ingest.NewEnforcer(wnc, wjs, dec, ingest.EnforcerOptions{
		WorkerID: "approver",
		Worker: ingest.WorkerOptions{Chains: []*receipts.Chain{receipts.NewChain("approval-worker", key)},
			Source: "talos://enforce/test", AckWait: 3 * time.Second},
		Keys:              keys,
		HeartbeatInterval: 200 * time.Millisecond,
		RegistryDigest:    func() string { return dec.State().Registry().Digest() },
	})
	if err != nil {
		t.Fatal(err)
	}
	fol := enf.Follower()
	svc, err := control.NewControlService(nc, js, control.ControlOptions{
		Chain: receipts.NewChain("approval-control", key), Source: "talos://control/test", ResponderKeys: responders,
		Hooks: control.ControlHooks{
			Precheck: fol.Precheck(control.StatePrecheck(dec.State, ledger), 5*time.Second),
			View:     func() schemas.IncidentView { return dec.State().View() },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { _ = enf.Run(ctx); done <- struct{}{} }()
	go func() { _ = svc.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := fol.WaitCaughtUp(wctx); err != nil {
		t.Fatal(err)
	}
	client, err := ep.NewClient(nc, js, "test-ep")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return &approvalPlane{nc: nc, js: js, client: client, ctl: control.NewControlClient(nc, responder, "alice@test"), fol: fol, keys: keys}
}

// resolve sends approve or reject of toolCallID with reason.
func (p *approvalPlane) resolve(t *testing.T, verb, toolCallID, reason string) *schemas.ControlReply {
	t.Helper()
	cmd := p.ctl.NewCommand(verb)
	cmd.Target, cmd.Reason = toolCallID, reason
	return do(t, p.ctl, cmd)
}

// toolCallEvent waits for the ToolCallEvent of toolCallID in TALOS_AUDIT.
func (p *approvalPlane) toolCallEvent(t *testing.T, toolCallID string) schemas.ToolCallEvent {
	t.Helper()
	var found *schemas.ToolCallEvent
	testenv.WaitFor(t, 15*time.Second, func() bool {
		for _, m := range testenv.StreamMsgs(t, p.js, schemas.StreamAudit) {
			if m.Subject != schemas.ToolCallEventSubject("community") {
				continue
			}
			var ev struct {
				Data schemas.ToolCallEvent `json:"data"`
			}
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatalf("toolcall event: %v", err)
			}
			if ev.Data.ToolCallID == toolCallID {
				found = &ev.Data
				return true
			}
		}
		return false
	})
	return *found
}

// TestApprovalThroughControlPlane: a community tool's call is decided
// require_approval with a signed receipt; approve is a signed control
// event (its receipt and TALOS_CONTROL seq) that an enforcement point
// listening on talos.control.approve reads with <ep_id>:<tool_call_id> as
// its target; a tool_call_id two enforcement points parked must be named
// with the ep_id, and resolving one call leaves the other parked; a second
// approve or a reject of it is CTL_CONFLICT; an id no call has is
// CTL_NOT_FOUND and an allowed call's is CTL_INVALID; the post event after
// an approval is not flagged, after a rejection it is.
func TestApprovalThroughControlPlane(t *testing.T) {
	p := newApprovalPlane(t)
	nc := p.nc
	// What a gateway parking calls listens to.
	events := make(chan *nats.Msg, 8)
	for _, v := range []string{schemas.VerbApprove, schemas.VerbReject} {
		if _, err := nc.ChanSubscribe(schemas.ControlSubject(v), events); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	parked := newCall(t, "community", "search", map[string]any{"q": "weather"})
	d, err := p.client.Call(ctx, parked)
	if err != nil {
		t.Fatal(err)
	}
	checkDecision(t, d)
	if d.Decision != schemas.DecisionRequireApproval || !slices.Equal(d.ReasonCodes, []string{schemas.CodeApprovalRequired}) || d.ReceiptID == "" {
		t.Fatalf("community call: %s %v receipt %q", d.Decision, d.ReasonCodes, d.ReceiptID)
	}
	if _, err := verify.VerifyEvent(d.Receipt, p.keys); err != nil {
		t.Fatalf("require_approval receipt does not verify: %v", err)
	}

	// Refusals first: nothing parked under these ids.
	if rep := p.resolve(t, schemas.VerbApprove, uuid.NewString(), ""); rep.OK || rep.Code != schemas.CtlNotFound ||
		!strings.Contains(rep.Error, "no call with this tool_call_id awaits approval") {
		t.Fatalf("approve of an unknown id: %+v", rep)
	}
	allowed := newCall(t, "files", "read_file", map[string]any{"path": "a.txt"})
	if d, err := p.client.Call(ctx, allowed); err != nil || d.Decision != schemas.DecisionAllow {
		t.Fatalf("files call: %+v %v", d, err)
	}
	// Only calls parked for approval are recorded for approve and reject:
	// an allowed call is not among them.
	if rep := p.resolve(t, schemas.VerbApprove, allowed.ToolCallID, ""); rep.OK || rep.Code != schemas.CtlNotFound {
		t.Fatalf("approve of an allowed call: %+v", rep)
	}

	// A second enforcement point parks a call with the same tool_call_id:
	// the bare id names no one call.
	twin, err := ep.NewClient(p.nc, p.js, "ep-2")
	if err != nil {
		t.Fatal(err)
	}
	shadow, err := ep.NewCall("ep-2", "community", "search", map[string]any{"q": "weather"})
	if err != nil {
		t.Fatal(err)
	}
	shadow.ToolCallID = parked.ToolCallID
	if d, err := twin.Call(ctx, shadow); err != nil || d.Decision != schemas.DecisionRequireApproval {
		t.Fatalf("ep-2's call with the same tool_call_id: %+v %v", d, err)
	}
	if rep := p.resolve(t, schemas.VerbApprove, parked.ToolCallID, ""); rep.OK || rep.Code != schemas.CtlInvalid ||
		!strings.Contains(rep.Error, "ep-2, test-ep") {
		t.Fatalf("approve of an id two enforcement points parked: %+v", rep)
	}
	target := schemas.EPCallID("test-ep", parked.ToolCallID)
	rep := p.resolve(t, schemas.VerbApprove, target, "looked at the query")
	if !rep.OK || rep.Seq == 0 || rep.ReceiptID == "" {
		t.Fatalf("approve: %+v", rep)
	}
	select {
	case m := <-events:
		ev, err := verify.VerifyEvent(m.Data, p.keys)
		if err != nil {
			t.Fatalf("approve event does not verify: %v", err)
		}
		c := ev.Data.Control
		if m.Subject != schemas.ControlSubject(schemas.VerbApprove) || ev.ID != rep.ReceiptID || c == nil || !c.Accepted ||
			c.Verb != schemas.VerbApprove || c.Target != target || c.Seq != rep.Seq ||
			c.Command == nil || c.Command.Target != target || c.Actor != "alice@test" {
			t.Fatalf("approve event on %s: %+v", m.Subject, c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no approve event on " + schemas.ControlSubject(schemas.VerbApprove))
	}
	for _, verb := range []string{schemas.VerbApprove, schemas.VerbReject} {
		if again := p.resolve(t, verb, target, "second thoughts"); again.OK || again.Code != schemas.CtlConflict {
			t.Fatalf("%s after approve: %+v", verb, again)
		}
	}
	// ep-2's call is still parked: the approval was test-ep's.
	if twinRep := p.resolve(t, schemas.VerbReject, schemas.EPCallID("ep-2", parked.ToolCallID), "not this one"); !twinRep.OK {
		t.Fatalf("reject of ep-2's call after test-ep's was approved: %+v", twinRep)
	}
	select {
	case m := <-events:
		if ev, err := verify.VerifyEvent(m.Data, p.keys); err != nil || ev.Data.Control.Target != schemas.EPCallID("ep-2", parked.ToolCallID) {
			t.Fatalf("ep-2's reject event: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reject event for ep-2's call")
	}

	// The worker has applied the approval before the gateway's post event
	// reaches it (in production the gateway runs the tool first).
	testenv.WaitFor(t, 10*time.Second, func() bool { return p.fol.Applied() >= rep.Seq })
	post, err := ep.PostOf(parked, map[string]any{"content": []any{map[string]any{"type": "text", "text": "sunny"}}}, true, time.Now(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if d, err := p.client.Call(ctx, post); err != nil || d.Decision != schemas.DecisionAllow {
		t.Fatalf("post after approval: %+v %v", d, err)
	}
	if ev := p.toolCallEvent(t, parked.ToolCallID); len(ev.Flags) != 0 || ev.Phase != schemas.PhasePost || !ev.OK {
		t.Fatalf("ToolCallEvent after approval: flags %v phase %s ok %v", ev.Flags, ev.Phase, ev.OK)
	}

	// A rejected call: reject needs a reason, then its post event (had the
	// tool run anyway) is flagged.
	other := newCall(t, "community", "search", map[string]any{"q": "secrets"})
	if d, err := p.client.Call(ctx, other); err != nil || d.Decision != schemas.DecisionRequireApproval {
		t.Fatalf("second community call: %+v %v", d, err)
	}
	if rep := p.resolve(t, schemas.VerbReject, other.ToolCallID, ""); rep.OK || rep.Code != schemas.CtlInvalid {
		t.Fatalf("reject without a reason: %+v", rep)
	}
	rej := p.resolve(t, schemas.VerbReject, other.ToolCallID, "asks for secrets") // one call parked it: the bare id will do
	if !rej.OK || rej.Seq <= rep.Seq {
		t.Fatalf("reject: %+v", rej)
	}
	select {
	case m := <-events:
		ev, err := verify.VerifyEvent(m.Data, p.keys)
		if err != nil || m.Subject != schemas.ControlSubject(schemas.VerbReject) || ev.Data.Control == nil ||
			ev.Data.Control.Target != schemas.EPCallID("test-ep", other.ToolCallID) || ev.Data.Control.Reason != "asks for secrets" {
			t.Fatalf("reject event on %s: %v", m.Subject, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reject event")
	}
	if again := p.resolve(t, schemas.VerbApprove, other.ToolCallID, ""); again.OK || again.Code != schemas.CtlConflict {
		t.Fatalf("approve after reject: %+v", again)
	}
	testenv.WaitFor(t, 10*time.Second, func() bool { return p.fol.Applied() >= rej.Seq })
	post, err = ep.PostOf(other, map[string]any{"content": []any{}}, true, time.Now(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.Call(ctx, post); err != nil {
		t.Fatal(err)
	}
	if ev := p.toolCallEvent(t, other.ToolCallID); !slices.Equal(ev.Flags, []string{schemas.FlagPostAfterDeny}) {
		t.Fatalf("ToolCallEvent after rejection: flags %v", ev.Flags)
	}
}
