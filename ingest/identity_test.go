package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/natsserver"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// epConn is an enforcement point logged in as its own NATS user.
type epConn struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	client *ep.Client
	errs   chan error // the connection's asynchronous errors (permission violations)
}

// dialEP logs in as enforcement point epID from the users file a.
func dialEP(t *testing.T, url string, a *natsauth.File, epID string) *epConn {
	t.Helper()
	u, ok := a.Find(schemas.NATSRoleEnforcement, epID)
	if !ok {
		t.Fatalf("no user for enforcement point %s", epID)
	}
	c := &epConn{errs: make(chan error, 16)}
	opts := append(u.ConnectOptions(), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case c.errs <- err:
		default:
		}
	}))
	var err error
	if c.nc, err = nats.Connect(url, opts...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.nc.Close)
	if c.js, err = jetstream.New(c.nc); err != nil {
		t.Fatal(err)
	}
	if c.client, err = ep.NewClient(c.nc, c.js, epID); err != nil {
		t.Fatal(err)
	}
	return c
}

// receiptData is the part of a decision's receipt these tests read.
func receiptData(t *testing.T, d *schemas.Decision) schemas.Receipt {
	t.Helper()
	var ev struct {
		Data schemas.Receipt `json:"data"`
	}
	if err := json.Unmarshal(d.Receipt, &ev); err != nil {
		t.Fatal(err)
	}
	return ev.Data
}

// TestEnforcementPointIdentity runs the pipeline with NATS authentication
// as talosd sets it up (the users file, each enforcement point its own
// user) and attacks it as enforcement point alpha: a call naming beta is
// denied and recorded as alpha's; alpha may not publish on beta's subjects;
// a tool_call_id alpha used first neither drops nor answers beta's call;
// and a Nats-Msg-Id alpha forges in beta's name makes beta's call fail
// closed instead of being taken for sent.
func TestEnforcementPointIdentity(t *testing.T) {
	dir := t.TempDir()
	users, _, err := natsauth.Ensure(filepath.Join(dir, "nats-auth.json"), []string{"alpha", "beta"})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := testenv.StartNATS(testenv.NATSOptions{Dir: filepath.Join(dir, "nats"), Users: natsserver.Users(users)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	worker, _ := users.Find(schemas.NATSRoleWorker, "")
	s := newStack(t, stackOptions{natsURL: ns.URL(), natsOpts: worker.ConnectOptions(),
		configure: func(t *testing.T, js jetstream.JetStream, o *enforce.DeciderOptions) {
			ledger := newLedger(t, js)
			o.Ledger = ledger
		}})
	alpha, beta := dialEP(t, ns.URL(), users, "alpha"), dialEP(t, ns.URL(), users, "beta")
	betaDecisions, err := beta.nc.SubscribeSync(schemas.DecisionSubjects("beta"))
	if err != nil {
		t.Fatal(err)
	}
	if err := beta.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("a call naming another enforcement point", func(t *testing.T) {
		spoof, err := ep.NewCall("beta", "files", "list_directory", map[string]any{"path": "."})
		if err != nil {
			t.Fatal(err)
		}
		d, err := alpha.client.Call(ctx, spoof)
		if err != nil {
			t.Fatalf("alpha got no answer on its own subject: %v", err)
		}
		checkDecision(t, d)
		if d.Decision != schemas.DecisionDeny || !slices.Equal(d.ReasonCodes, []string{schemas.CodeDenyEPIDMismatch}) {
			t.Fatalf("spoofed call: %s %v, want deny %s", d.Decision, d.ReasonCodes, schemas.CodeDenyEPIDMismatch)
		}
		if r := receiptData(t, d); r.EPID != "alpha" || r.ToolCallID != spoof.ToolCallID {
			t.Fatalf("the receipt names %q for %s, want the publisher alpha", r.EPID, r.ToolCallID)
		}
		where := fmt.Sprintf("tool_call_id = '%s'", spoof.ToolCallID)
		s.waitRows(t, query.ViewDecisions, where+" AND ep_id = 'alpha' AND has(reason_codes, 'DENY_EP_ID_MISMATCH')", 1)
		if n := countRows(t, s, query.ViewDecisions, where+" AND ep_id != 'alpha'"); n != 0 {
			t.Fatalf("v_decisions records the spoofed call for another enforcement point (%d rows)", n)
		}
		if m, err := betaDecisions.NextMsg(500 * time.Millisecond); err == nil {
			t.Fatalf("beta was answered for alpha's call: %s", m.Data)
		}
	})

	t.Run("publishing on another enforcement point's subject", func(t *testing.T) {
		info, err := s.js.Stream(ctx, schemas.StreamCalls)
		if err != nil {
			t.Fatal(err)
		}
		before := info.CachedInfo().State.LastSeq
		call, _ := ep.NewCall("beta", "files", "list_directory", map[string]any{"path": "."})
		raw, _ := json.Marshal(call)
		subject := schemas.CallSubject(schemas.PhasePre, "beta", "files")
		msg := &nats.Msg{Subject: subject, Data: raw, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, schemas.CallMsgID("beta", call.ToolCallID, schemas.PhasePre, raw))
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		if _, err := alpha.js.PublishMsg(pctx, msg); err == nil {
			t.Fatal("alpha's publish on beta's subject was acknowledged")
		}
		waitViolation(t, alpha.errs, subject)
		after, err := info.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after.State.LastSeq != before {
			t.Fatalf("TALOS_CALLS went from seq %d to %d: the refused publish was stored", before, after.State.LastSeq)
		}
	})

	t.Run("a tool_call_id taken first by another enforcement point", func(t *testing.T) {
		applyKillSwitch(t, s, "tool:files/read_file")
		claim, _ := ep.NewCall("alpha", "files", "list_directory", map[string]any{"path": "."})
		if d, err := alpha.client.Call(ctx, claim); err != nil || d.Decision != schemas.DecisionAllow {
			t.Fatalf("alpha's call: %+v %v", d, err)
		}
		victim, _ := ep.NewCall("beta", "files", "read_file", map[string]any{"path": "notes.txt"})
		victim.ToolCallID = claim.ToolCallID
		d, err := beta.client.Call(ctx, victim)
		if err != nil {
			t.Fatalf("beta's call with alpha's tool_call_id: %v", err)
		}
		checkDecision(t, d)
		if d.Decision != schemas.DecisionDeny || !slices.Contains(d.ReasonCodes, schemas.CodeKillSwitch) {
			t.Fatalf("beta's call under a kill switch: %s %v, want deny %s", d.Decision, d.ReasonCodes, schemas.CodeKillSwitch)
		}
		if r := receiptData(t, d); r.EPID != "beta" || r.ToolName != "read_file" {
			t.Fatalf("beta was answered with %q's receipt for %s", r.EPID, r.ToolName)
		}
		where := fmt.Sprintf("tool_call_id = '%s'", claim.ToolCallID)
		s.waitRows(t, query.ViewDecisions, where, 2)
		for ep, want := range map[string]string{"alpha": schemas.DecisionAllow, "beta": schemas.DecisionDeny} {
			if n := countRows(t, s, query.ViewDecisions, fmt.Sprintf("%s AND ep_id = '%s' AND decision = '%s'", where, ep, want)); n != 1 {
				t.Errorf("v_decisions: %d rows of %s's call decided %s, want 1", n, ep, want)
			}
		}
	})

	t.Run("a Nats-Msg-Id forged in another enforcement point's name", func(t *testing.T) {
		// NATS lets alpha set any header, but beta's Nats-Msg-Id ends in a
		// digest of envelope bytes alpha cannot know before beta sends
		// them: the ids alpha can forge take nothing from beta.
		victim, _ := ep.NewCall("beta", "files", "list_directory", map[string]any{"path": "."})
		forged, _ := ep.NewCall("alpha", "files", "list_directory", map[string]any{"path": "."})
		raw, _ := json.Marshal(forged)
		guess, _ := json.Marshal(victim) // even the victim's envelope as alpha could guess it
		guess[len(guess)-1] = ' '
		guess = append(guess, '}')
		for _, id := range []string{"beta:" + victim.ToolCallID + ":pre", schemas.CallMsgID("beta", victim.ToolCallID, schemas.PhasePre, guess)} {
			msg := &nats.Msg{Subject: schemas.CallSubject(schemas.PhasePre, "alpha", "files"), Data: raw, Header: nats.Header{}}
			msg.Header.Set(jetstream.MsgIDHeader, id)
			if _, err := alpha.js.PublishMsg(ctx, msg); err != nil {
				t.Fatal(err)
			}
		}
		d, err := beta.client.Call(ctx, victim)
		if err != nil {
			t.Fatalf("beta's call after alpha forged its Nats-Msg-Ids: %v", err)
		}
		checkDecision(t, d)
		if d.Decision != schemas.DecisionAllow {
			t.Fatalf("beta's call: %s %v, want allow", d.Decision, d.ReasonCodes)
		}
		// Beta's own retry of a publish is not refused.
		own, _ := ep.NewCall("beta", "files", "list_directory", map[string]any{"path": "."})
		ownRaw, _ := json.Marshal(own)
		for i := range 2 {
			if err := beta.client.Publish(ctx, schemas.PhasePre, "files", own.ToolCallID, ownRaw); err != nil {
				t.Fatalf("publish #%d of beta's own call: %v", i+1, err)
			}
		}
	})
}

// countRows counts the rows of view matching where.
func countRows(t *testing.T, s *stack, view, where string) uint64 {
	t.Helper()
	var n uint64
	if err := s.conn.QueryRow(context.Background(), fmt.Sprintf("SELECT count() FROM %s.%s WHERE %s", s.db, view, where)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitViolation waits for a permission violation naming subject among a
// connection's asynchronous errors.
func waitViolation(t *testing.T, errs <-chan error, subject string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
				return
			}
		case <-timeout:
			t.Fatalf("no permission violation for a publish on %s", subject)
		}
	}
}

// applyKillSwitch sets a kill switch on the stack's worker, as a control
// event would.
func applyKillSwitch(t *testing.T, s *stack, scope string) {
	t.Helper()
	cmd := &schemas.ControlCommand{SchemaVersion: schemas.ControlCommandVersion, CommandID: uuid.NewString(),
		Verb: schemas.VerbKillSwitchSet, Actor: "test", Reason: "drill", Scope: scope,
		IssuedAt: time.Now().UTC().Format(schemas.TimeFormat)}
	rec := &schemas.ControlRecord{CommandID: cmd.CommandID, Verb: cmd.Verb, Actor: cmd.Actor, Reason: cmd.Reason,
		Target: scope, Accepted: true, Command: cmd, Seq: s.dec.State().Seq() + 1}
	if err := s.dec.Apply(rec.Seq, rec, time.Now()); err != nil {
		t.Fatal(err)
	}
}
