package control_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// controlEnv is an embedded NATS with the Talos streams, a responder key
// the control services trust, and the key their receipts are signed with.
type controlEnv struct {
	url        string
	nc         *nats.Conn
	js         jetstream.JetStream
	responder  *receipts.PrivateKey
	responders verify.KeySet
	signer     *receipts.PrivateKey
	signers    verify.KeySet // verifies control receipts
}

func newControlEnv(t *testing.T) *controlEnv {
	t.Helper()
	n := testenv.NATSForTest(t)
	e := &controlEnv{url: n.URL()}
	e.nc, e.js = testenv.ConnectJS(t, e.url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ingest.EnsureStreams(ctx, e.js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.responder, err = receipts.GenerateKey(); err != nil {
		t.Fatal(err)
	}
	e.responders = verify.KeySet{}
	e.responders.Add(e.responder.Public())
	if e.signer, err = receipts.GenerateKey(); err != nil {
		t.Fatal(err)
	}
	e.signers = verify.KeySet{}
	e.signers.Add(e.signer.Public())
	return e
}

// startControl runs a control service with its own connection and chain
// until the test ends.
func (e *controlEnv) startControl(t *testing.T, chainID string, mod func(*control.ControlOptions)) {
	t.Helper()
	nc, js := testenv.ConnectJS(t, e.url)
	o := control.ControlOptions{
		Chain:         receipts.NewChain(chainID, e.signer),
		Source:        "talos://control/" + chainID,
		ResponderKeys: e.responders,
	}
	if mod != nil {
		mod(&o)
	}
	s, err := control.NewControlService(nc, js, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("control service %s: %v", chainID, err)
		}
	})
	// Ready once this instance answers (the queue group may route a ping
	// to another one); each ping leaves an unknown-verb refusal receipt.
	testenv.WaitFor(t, 10*time.Second, func() bool {
		m, err := nc.Request(schemas.CtlSubject("ping"), []byte("{}"), time.Second)
		if err != nil {
			return false
		}
		var r schemas.ControlReply
		if json.Unmarshal(m.Data, &r) != nil {
			return false
		}
		for _, am := range testenv.StreamMsgs(t, e.js, schemas.StreamAudit) {
			var ev struct{ ID, Source string }
			if json.Unmarshal(am.Data, &ev) == nil && ev.ID == r.ReceiptID {
				return ev.Source == o.Source
			}
		}
		return false
	})
}

func (e *controlEnv) client() *control.ControlClient {
	return control.NewControlClient(e.nc, e.responder, "alice")
}

func do(t *testing.T, c *control.ControlClient, cmd *schemas.ControlCommand) *schemas.ControlReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	r, err := c.Do(ctx, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// request sends raw bytes to a control subject and decodes the reply.
func (e *controlEnv) request(t *testing.T, verb string, raw []byte) *schemas.ControlReply {
	t.Helper()
	m, err := e.nc.Request(schemas.CtlSubject(verb), raw, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r schemas.ControlReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("%v: %s", err, m.Data)
	}
	return &r
}

type controlEvent struct {
	ID      string          `json:"id"`
	Subject string          `json:"subject"`
	Type    string          `json:"type"`
	Data    schemas.Receipt `json:"data"`
}

func decodeEvent(t *testing.T, raw []byte) controlEvent {
	t.Helper()
	var ev controlEvent
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	return ev
}

// waitCopied waits until the copier has acked every TALOS_CONTROL event.
func (e *controlEnv) waitCopied(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testenv.WaitFor(t, 10*time.Second, func() bool {
		st, err := e.js.Stream(ctx, schemas.StreamControl)
		if err != nil {
			return false
		}
		si, err := st.Info(ctx)
		if err != nil {
			return false
		}
		ci, err := st.Consumer(ctx, control.ControlAuditConsumer)
		if err != nil {
			return false
		}
		info, err := ci.Info(ctx)
		return err == nil && info.AckFloor.Stream == si.State.LastSeq && info.NumAckPending == 0
	})
}

// checkAudit verifies and schema-validates every receipt in TALOS_AUDIT,
// checks every chain has no gap, fork or bad link, and that no receipt
// is stored twice. It returns the events by id.
func (e *controlEnv) checkAudit(t *testing.T, extra verify.KeySet) map[string][]byte {
	t.Helper()
	keys := verify.KeySet{}
	for k, v := range e.signers {
		keys[k] = v
	}
	for k, v := range extra {
		keys[k] = v
	}
	var all [][]byte
	byID := map[string][]byte{}
	for _, m := range testenv.StreamMsgs(t, e.js, schemas.StreamAudit) {
		if err := schemas.ValidateReceiptEvent(m.Data); err != nil {
			t.Errorf("audit seq %d fails the receipt schema: %v\n%s", m.Sequence, err, m.Data)
		}
		ev := decodeEvent(t, m.Data)
		if _, dup := byID[ev.ID]; dup {
			t.Errorf("receipt %s stored twice in TALOS_AUDIT", ev.ID)
		}
		if want := schemas.ReceiptSubject(schemas.KindControl, ev.Subject); m.Subject != want {
			t.Errorf("receipt %s on %s, want %s", ev.ID, m.Subject, want)
		}
		byID[ev.ID] = m.Data
		all = append(all, m.Data)
	}
	verify.SortForVerify(all)
	v := verify.NewVerifier(keys)
	for _, raw := range all {
		v.Add(raw)
	}
	rep := v.Finish()
	for _, p := range rep.Problems {
		t.Errorf("audit chain: %s", p)
	}
	return byID
}

func killSwitch(c *control.ControlClient, scope string) *schemas.ControlCommand {
	cmd := c.NewCommand(schemas.VerbKillSwitchSet)
	cmd.Scope, cmd.Reason = scope, "incident 7"
	return cmd
}

func TestControlAcceptedMutation(t *testing.T) {
	e := newControlEnv(t)
	e.startControl(t, "control-a", nil)
	c := e.client()

	cmd := killSwitch(c, "server:github")
	r := do(t, c, cmd)
	if !r.OK || r.Seq != 1 || r.ReceiptID == "" || r.Code != "" {
		t.Fatalf("reply %+v", r)
	}
	ctl := testenv.StreamMsgs(t, e.js, schemas.StreamControl)
	if len(ctl) != 1 || ctl[0].Sequence != r.Seq || ctl[0].Subject != schemas.ControlSubject(schemas.VerbKillSwitchSet) {
		t.Fatalf("TALOS_CONTROL: %d events; want one at seq %d", len(ctl), r.Seq)
	}
	raw := ctl[0].Data
	if got := ctl[0].Header.Get(jetstream.MsgIDHeader); got != cmd.CommandID {
		t.Errorf("Nats-Msg-Id %q, want the command id %s", got, cmd.CommandID)
	}
	if err := schemas.ValidateReceiptEvent(raw); err != nil {
		t.Fatalf("receipt schema: %v\n%s", err, raw)
	}
	ev, err := verify.VerifyEvent(raw, e.signers)
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID != r.ReceiptID || ev.Type != schemas.TypeReceiptControl || ev.Subject != schemas.VerbKillSwitchSet {
		t.Fatalf("event %s %s %s", ev.ID, ev.Type, ev.Subject)
	}
	d := ev.Data
	ctrl := d.Control
	if ctrl == nil || !ctrl.Accepted || ctrl.Seq != ctl[0].Sequence || ctrl.CommandID != cmd.CommandID ||
		ctrl.Target != "server:github" || ctrl.Actor != "alice" || ctrl.ResponderKID != e.responder.KID || ctrl.Code != "" {
		t.Fatalf("control record %+v", ctrl)
	}
	if d.EventType != "control" || d.Tool != schemas.VerbKillSwitchSet || d.ToolID != "control/killswitch.set" ||
		d.ResultCode != "accepted" || d.Decision != "allow" || len(d.ReasonCodes) != 0 || d.AgentID != "alice" {
		t.Fatalf("receipt %+v", d)
	}
	if d.EnvelopeHash != ctrl.CommandHash || len(d.EnvelopeHash) != 64 {
		t.Fatalf("envelope hash %q, command hash %q", d.EnvelopeHash, ctrl.CommandHash)
	}
	// The embedded command carries the responder's signature, so an
	// auditor can check who asked.
	if ctrl.Command == nil {
		t.Fatal("accepted receipt without the command")
	}
	if kid, err := receipts.VerifyCommand(ctrl.Command, e.responders); err != nil || kid != e.responder.KID {
		t.Fatalf("embedded command signature: %v", err)
	}

	// TALOS_AUDIT holds the very same bytes, once, even after the copier ran.
	e.waitCopied(t)
	byID := e.checkAudit(t, nil)
	if !bytes.Equal(byID[r.ReceiptID], raw) {
		t.Fatalf("TALOS_AUDIT copy differs:\n%s\n%s", byID[r.ReceiptID], raw)
	}
}

func TestControlRefusals(t *testing.T) {
	e := newControlEnv(t)
	e.startControl(t, "control-a", func(o *control.ControlOptions) {
		o.Hooks.Precheck = func(_ context.Context, cmd *schemas.ControlCommand, _ uint64) control.Verdict {
			if cmd.Verb == schemas.VerbRegistryPin {
				return control.Verdict{Code: schemas.CtlNotFound, Detail: "digest " + cmd.Digest + " was never published"}
			}
			return control.Verdict{}
		}
	})
	c := e.client()
	other, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signed := func(cmd *schemas.ControlCommand, key *receipts.PrivateKey) []byte {
		if key != nil {
			if err := receipts.SignCommand(key, cmd); err != nil {
				t.Fatal(err)
			}
		}
		b, err := json.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name string
		verb string
		raw  func() []byte
		code string
	}{
		{"unsigned", schemas.VerbKillSwitchSet, func() []byte { return signed(killSwitch(c, "global"), nil) }, schemas.CtlUnsigned},
		{"other key", schemas.VerbKillSwitchSet, func() []byte { return signed(killSwitch(c, "global"), other) }, schemas.CtlUntrustedKey},
		{"tampered", schemas.VerbKillSwitchSet, func() []byte {
			cmd := killSwitch(c, "global")
			signed(cmd, e.responder)
			cmd.Scope = "server:github" // changed after signing, still valid
			return signed(cmd, nil)
		}, schemas.CtlSignatureInvalid},
		{"bad signature encoding", schemas.VerbKillSwitchSet, func() []byte {
			cmd := killSwitch(c, "global")
			signed(cmd, e.responder)
			cmd.Signature.Sig = "AAAA"
			return signed(cmd, nil)
		}, schemas.CtlSignatureInvalid},
		{"stale", schemas.VerbKillSwitchSet, func() []byte {
			cmd := killSwitch(c, "global")
			cmd.IssuedAt = time.Now().Add(-10 * time.Minute).UTC().Format(schemas.TimeFormat)
			return signed(cmd, e.responder)
		}, schemas.CtlStale},
		{"missing reason", schemas.VerbKillSwitchSet, func() []byte {
			cmd := killSwitch(c, "global")
			cmd.Reason = ""
			return signed(cmd, e.responder)
		}, schemas.CtlInvalid},
		{"verb mismatch", schemas.VerbKillSwitchClear, func() []byte { return signed(killSwitch(c, "global"), e.responder) }, schemas.CtlVerbMismatch},
		{"not JSON", schemas.VerbKillSwitchSet, func() []byte { return []byte("kill everything") }, schemas.CtlMalformed},
		{"unknown field", schemas.VerbKillSwitchSet, func() []byte {
			b := signed(killSwitch(c, "global"), e.responder)
			return bytes.Replace(b, []byte(`{`), []byte(`{"force":true,`), 1)
		}, schemas.CtlMalformed},
		{"unknown verb", "killswitch.toggle", func() []byte { return signed(killSwitch(c, "global"), e.responder) }, schemas.CtlUnknownVerb},
		{"precheck", schemas.VerbRegistryPin, func() []byte {
			cmd := c.NewCommand(schemas.VerbRegistryPin)
			cmd.Digest = "sha256:" + strings.Repeat("0", 64)
			return signed(cmd, e.responder)
		}, schemas.CtlNotFound},
		{"flush without a replay store", schemas.VerbReplayFlush, func() []byte {
			cmd := c.NewCommand(schemas.VerbReplayFlush)
			cmd.Reason = "rotate"
			return signed(cmd, e.responder)
		}, schemas.CtlInternal},
		{"read without a view", schemas.VerbKillSwitchList, func() []byte {
			return signed(c.NewCommand(schemas.VerbKillSwitchList), e.responder)
		}, schemas.CtlInternal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw := tc.raw()
			auditBefore := len(testenv.StreamMsgs(t, e.js, schemas.StreamAudit))
			r := e.request(t, tc.verb, raw)
			if r.OK || r.Code != tc.code || r.Error == "" || r.Seq != 0 || r.ReceiptID == "" {
				t.Fatalf("reply %+v, want refusal %s", r, tc.code)
			}
			if n := len(testenv.StreamMsgs(t, e.js, schemas.StreamControl)); n != 0 {
				t.Fatalf("TALOS_CONTROL has %d events after a refusal", n)
			}
			audit := testenv.StreamMsgs(t, e.js, schemas.StreamAudit)
			if len(audit) != auditBefore+1 {
				t.Fatalf("TALOS_AUDIT grew by %d, want one refusal receipt", len(audit)-auditBefore)
			}
			last := audit[len(audit)-1]
			ev := decodeEvent(t, last.Data)
			ctrl := ev.Data.Control
			if ev.ID != r.ReceiptID || ctrl == nil || ctrl.Accepted || ctrl.Code != tc.code || ctrl.Command != nil ||
				ev.Data.Decision != "deny" || ev.Data.ResultCode != tc.code || !slices.Equal(ev.Data.ReasonCodes, []string{tc.code}) {
				t.Fatalf("refusal receipt %s", last.Data)
			}
			if ctrl.CommandHash != ev.Data.EnvelopeHash || ctrl.Seq != 0 {
				t.Fatalf("refusal record %+v", ctrl)
			}
			wantSubject := tc.verb
			if tc.code == schemas.CtlUnknownVerb {
				wantSubject = "unknown"
			}
			if ev.Subject != wantSubject || last.Subject != schemas.ReceiptSubject(schemas.KindControl, wantSubject) {
				t.Fatalf("refusal receipt subject %q on %s", ev.Subject, last.Subject)
			}
		})
	}
	e.checkAudit(t, nil)
}

func TestControlSameCommandTwice(t *testing.T) {
	e := newControlEnv(t)
	e.startControl(t, "control-a", nil)
	c := e.client()

	cmd := killSwitch(c, "global")
	first := do(t, c, cmd)
	second := do(t, c, cmd) // re-signed: same bytes, same command_id
	if !first.OK || !second.OK || first.Seq != second.Seq || first.ReceiptID != second.ReceiptID {
		t.Fatalf("first %+v, second %+v", first, second)
	}
	// Other bytes under a command_id already used are refused.
	reuse := *cmd
	reuse.Reason = "another reason"
	if r := do(t, c, &reuse); r.OK || r.Code != schemas.CtlInvalid {
		t.Fatalf("command id reused by another command: %+v", r)
	}
	third := do(t, c, killSwitch(c, "agent:bot-1"))
	if !third.OK || third.Seq != first.Seq+1 {
		t.Fatalf("next command: %+v", third)
	}
	if n := len(testenv.StreamMsgs(t, e.js, schemas.StreamControl)); n != 2 {
		t.Fatalf("TALOS_CONTROL has %d events, want 2", n)
	}
	e.waitCopied(t)
	e.checkAudit(t, nil)

	// A new instance (a restart) still knows the command: it reads the
	// recent TALOS_CONTROL events at start, so a retry later than the
	// stream's duplicate window would still not append it twice.
	e.startControl(t, "control-b", nil)
	for range 4 { // the queue group picks either instance
		if r := do(t, c, cmd); !r.OK || r.Seq != first.Seq || r.ReceiptID != first.ReceiptID {
			t.Fatalf("retry after restart: %+v", r)
		}
	}
	if n := len(testenv.StreamMsgs(t, e.js, schemas.StreamControl)); n != 2 {
		t.Fatalf("TALOS_CONTROL has %d events, want 2", n)
	}
}

func TestControlTwoServicesAppendConcurrently(t *testing.T) {
	e := newControlEnv(t)
	e.startControl(t, "control-a", nil)
	e.startControl(t, "control-b", nil)

	const clients, each = 6, 8
	var wg sync.WaitGroup
	replies := make(chan *schemas.ControlReply, clients*each)
	errs := make(chan error, clients*each)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := e.client()
			for j := range each {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				r, err := c.Do(ctx, killSwitch(c, fmt.Sprintf("agent:bot-%d-%d", i, j)))
				cancel()
				if err != nil {
					errs <- err
					continue
				}
				replies <- r
			}
		}()
	}
	wg.Wait()
	close(replies)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seqs := map[uint64]bool{}
	for r := range replies {
		if !r.OK || seqs[r.Seq] {
			t.Fatalf("reply %+v (seq seen before: %v)", r, seqs[r.Seq])
		}
		seqs[r.Seq] = true
	}
	ctl := testenv.StreamMsgs(t, e.js, schemas.StreamControl)
	if len(ctl) != clients*each {
		t.Fatalf("TALOS_CONTROL has %d events, want %d", len(ctl), clients*each)
	}
	chains := map[string]int{}
	for i, m := range ctl {
		if m.Sequence != uint64(i+1) || !seqs[m.Sequence] {
			t.Fatalf("TALOS_CONTROL seq %d at position %d", m.Sequence, i)
		}
		ev, err := verify.VerifyEvent(m.Data, e.signers)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Data.Control.Seq != m.Sequence {
			t.Fatalf("event %s signs seq %d, stored at %d", ev.ID, ev.Data.Control.Seq, m.Sequence)
		}
		chains[ev.Data.Chain.ChainID]++
	}
	if chains["control-a"] == 0 || chains["control-b"] == 0 {
		t.Fatalf("one instance did all the appends: %v", chains)
	}
	e.waitCopied(t)
	accepted := 0
	for _, raw := range e.checkAudit(t, nil) {
		if decodeEvent(t, raw).Data.Control.Accepted {
			accepted++
		}
	}
	if accepted != clients*each {
		t.Fatalf("TALOS_AUDIT has %d accepted receipts, want %d", accepted, clients*each)
	}
}

// TestControlPrecheckSeesEveryEventBefore: a command is judged against
// every event it is stored after, also when another instance appends
// between its precheck and its append (here, an event stored behind the
// service's back while its precheck runs). The precheck refuses as one
// of approve and reject would once the other has resolved the call: the
// command is refused, not stored behind the event it was not judged
// against.
func TestControlPrecheckSeesEveryEventBefore(t *testing.T) {
	e := newControlEnv(t)
	var mu sync.Mutex
	var seen []uint64 // lastSeq of each precheck, in order
	prechecks := func() []uint64 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	e.startControl(t, "control-a", func(o *control.ControlOptions) {
		o.Hooks.Precheck = func(ctx context.Context, cmd *schemas.ControlCommand, lastSeq uint64) control.Verdict {
			mu.Lock()
			seen = append(seen, lastSeq)
			first := len(seen) == 1
			mu.Unlock()
			if cmd.Scope != "agent:raced" {
				return control.Verdict{}
			}
			if first {
				if _, err := e.js.Publish(ctx, schemas.ControlSubject(schemas.VerbKillSwitchSet), []byte(`{"from":"another instance"}`)); err != nil {
					t.Error(err)
				}
			}
			if lastSeq > 0 {
				return control.Verdict{Code: schemas.CtlConflict, Detail: "resolved at control seq " + strconv.FormatUint(lastSeq, 10)}
			}
			return control.Verdict{}
		}
	})
	c := e.client()
	r := do(t, c, killSwitch(c, "agent:raced"))
	if r.OK || r.Code != schemas.CtlConflict || r.Error != "resolved at control seq 1" {
		t.Fatalf("reply %+v; want %s against the event stored meanwhile (prechecks saw %v)", r, schemas.CtlConflict, prechecks())
	}
	if got := prechecks(); !slices.Equal(got, []uint64{0, 1}) {
		t.Fatalf("prechecks saw last seqs %v, want [0 1]", got)
	}
	if ctl := testenv.StreamMsgs(t, e.js, schemas.StreamControl); len(ctl) != 1 {
		t.Fatalf("TALOS_CONTROL has %d events, want only the one stored meanwhile", len(ctl))
	}
	// A command no one raced is judged once and stored after it.
	if r := do(t, c, killSwitch(c, "agent:calm")); !r.OK || r.Seq != 2 || !slices.Equal(prechecks(), []uint64{0, 1, 1}) {
		t.Fatalf("reply %+v after prechecks of %v; want seq 2 after one more precheck, at 1", r, prechecks())
	}
}

func TestControlCopierBackfillsAudit(t *testing.T) {
	e := newControlEnv(t)
	// A control event appended by a service that died before its direct
	// TALOS_AUDIT publish.
	chain := receipts.NewChain("control-dead", e.signer)
	data := &schemas.Receipt{
		EventType: "control", Tool: schemas.VerbQuarantineSet, ToolID: "control/quarantine.set", AgentID: "alice",
		Timestamp: time.Now().UTC().Format(schemas.TimeFormat), ResultCode: "accepted", Decision: "allow",
		ReasonCodes: []string{}, DocumentHashes: []schemas.DocumentHash{}, EnvelopeHash: strings.Repeat("a", 64),
		Control: &schemas.ControlRecord{CommandID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", Verb: schemas.VerbQuarantineSet,
			Actor: "alice", Reason: "r", Target: "sess-1", Accepted: true, Seq: 1, CommandHash: strings.Repeat("a", 64)},
	}
	sealed, err := chain.Seal(receipts.Meta{Type: schemas.TypeReceiptControl, Source: "talos://control/dead", Subject: schemas.VerbQuarantineSet}, data)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := &nats.Msg{Subject: schemas.ControlSubject(schemas.VerbQuarantineSet), Data: sealed.JSON, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, data.Control.CommandID)
	if _, err := e.js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if n := len(testenv.StreamMsgs(t, e.js, schemas.StreamAudit)); n != 0 {
		t.Fatalf("TALOS_AUDIT has %d messages before the copier ran", n)
	}

	e.startControl(t, "control-a", nil)
	e.waitCopied(t)
	audit := testenv.StreamMsgs(t, e.js, schemas.StreamAudit)
	var found bool
	for _, m := range audit {
		if bytes.Equal(m.Data, sealed.JSON) {
			found = true
			if m.Subject != schemas.ReceiptSubject(schemas.KindControl, schemas.VerbQuarantineSet) ||
				m.Header.Get(jetstream.MsgIDHeader) != "control:"+sealed.ID {
				t.Fatalf("copy on %s with id %q", m.Subject, m.Header.Get(jetstream.MsgIDHeader))
			}
		}
	}
	if !found {
		t.Fatal("the copier did not bring the control event to TALOS_AUDIT")
	}
	// The next append lands after it, at the seq it signs.
	c := e.client()
	if r := do(t, c, killSwitch(c, "global")); !r.OK || r.Seq != 2 {
		t.Fatalf("reply %+v", r)
	}
	e.waitCopied(t)
	e.checkAudit(t, nil)
}

type fakeReplay struct {
	mu      sync.Mutex
	flushed []string
}

func (f *fakeReplay) Stats(context.Context) (schemas.ReplayInfo, error) {
	return schemas.ReplayInfo{Keys: 42, Bytes: 4200, Window: "24h0m0s"}, nil
}

func (f *fakeReplay) Check(_ context.Context, session, corr string) (string, bool, error) {
	if session == "sess-1" && corr == "seen-corr" {
		return "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", true, nil
	}
	return "", false, nil
}

func (f *fakeReplay) Flush(_ context.Context, session string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flushed = append(f.flushed, session)
	return nil
}

func TestControlReadsAndReplay(t *testing.T) {
	e := newControlEnv(t)
	view := schemas.IncidentView{Seq: 7, KillSwitches: []schemas.StateEntry{{Target: "global", Reason: "r", Actor: "bob", Seq: 7}},
		Quarantines: []schemas.StateEntry{}, Revocations: []schemas.StateEntry{},
		Registry: schemas.RegistryView{Pinned: "sha256:" + strings.Repeat("1", 64), PinnedSeq: 3, Published: []schemas.PublishedBundle{}}}
	var views sync.Map
	replay := &fakeReplay{}
	sw, err := control.NewStatusWatcher(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	e.startControl(t, "control-a", func(o *control.ControlOptions) {
		o.Hooks.View = func() schemas.IncidentView { views.Store("called", true); return view }
		o.Hooks.Replay = replay
		o.Status = sw
	})
	c := e.client()

	// A worker heartbeat so status and replies have someone to name.
	hb, _ := json.Marshal(schemas.WorkerStatus{WorkerID: "w1", AppliedSeq: 0, CaughtUp: true, IntervalMS: 1000})
	if err := e.nc.Publish(schemas.StatusSubject("w1"), hb); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, func() bool { return len(sw.Live()) == 1 })

	for _, verb := range []string{schemas.VerbKillSwitchList, schemas.VerbQuarantineList, schemas.VerbRegistryShow} {
		r := do(t, c, c.NewCommand(verb))
		if !r.OK || r.State == nil || r.State.Seq != 7 || len(r.State.KillSwitches) != 1 || r.ReceiptID == "" || r.Seq != 0 {
			t.Fatalf("%s: %+v", verb, r)
		}
	}
	if _, ok := views.Load("called"); !ok {
		t.Fatal("View was not called")
	}
	r := do(t, c, c.NewCommand(schemas.VerbReplayStats))
	if !r.OK || r.Replay == nil || r.Replay.Keys != 42 {
		t.Fatalf("replay.stats: %+v", r)
	}
	check := c.NewCommand(schemas.VerbReplayCheck)
	check.SessionID, check.CorrelationID = "sess-1", "seen-corr"
	r = do(t, c, check)
	if !r.OK || r.Replay == nil || r.Replay.Seen == nil || !*r.Replay.Seen || r.Replay.ToolCall == "" {
		t.Fatalf("replay.check: %+v", r)
	}
	r = do(t, c, c.NewCommand(schemas.VerbStatus))
	if !r.OK || len(r.Status) != 1 || r.Status[0].WorkerID != "w1" || !slices.Equal(r.Workers, []string{"w1"}) {
		t.Fatalf("status: %+v", r)
	}

	flush := c.NewCommand(schemas.VerbReplayFlush)
	flush.SessionID, flush.Reason = "sess-9", "leaked ids"
	r = do(t, c, flush)
	if !r.OK || r.Seq != 1 || !slices.Equal(r.Workers, []string{"w1"}) {
		t.Fatalf("replay.flush: %+v", r)
	}
	replay.mu.Lock()
	flushed := slices.Clone(replay.flushed)
	replay.mu.Unlock()
	if !slices.Equal(flushed, []string{"sess-9"}) {
		t.Fatalf("flushed %v", flushed)
	}
	if n := len(testenv.StreamMsgs(t, e.js, schemas.StreamControl)); n != 1 {
		t.Fatalf("TALOS_CONTROL has %d events; only the flush mutates", n)
	}
	// Every read left an accepted receipt with its command in TALOS_AUDIT.
	e.waitCopied(t)
	byID := e.checkAudit(t, nil)
	accepted := 0
	for _, raw := range byID {
		ctrl := decodeEvent(t, raw).Data.Control
		if ctrl.Accepted && ctrl.Command != nil && ctrl.Code == "" {
			accepted++
		}
	}
	if accepted != 7 {
		t.Fatalf("%d accepted receipts in TALOS_AUDIT, want 7", accepted)
	}
}

func TestControlClientRetriesUntilAService(t *testing.T) {
	e := newControlEnv(t)
	c := e.client()
	done := make(chan *schemas.ControlReply, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r, err := c.Do(ctx, killSwitch(c, "global"))
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	time.Sleep(300 * time.Millisecond) // no responders meanwhile
	e.startControl(t, "control-a", nil)
	r := <-done
	if r == nil || !r.OK || r.Seq != 1 {
		t.Fatalf("reply %+v", r)
	}

	// And with nobody at all, Do ends with ctx.
	e2 := newControlEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	if _, err := e2.client().Do(ctx, killSwitch(c, "global")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no service: %v", err)
	}
}

// fakeWorker publishes heartbeats for id every interval, reporting the
// seq applied() returns, until stop is closed.
func fakeWorker(t *testing.T, nc *nats.Conn, id string, interval time.Duration, applied func() uint64, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			b, _ := json.Marshal(schemas.WorkerStatus{WorkerID: id, AppliedSeq: applied(), CaughtUp: true,
				IntervalMS: interval.Milliseconds(), Time: time.Now().UTC().Format(schemas.TimeFormat)})
			_ = nc.Publish(schemas.StatusSubject(id), b)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(wg.Wait)
	return &wg
}

func TestStatusWatcherWaitApplied(t *testing.T) {
	e := newControlEnv(t)
	w, err := control.NewStatusWatcher(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	var mu sync.Mutex
	seqs := map[string]uint64{"w1": 3, "w2": 3, "w3": 9}
	get := func(id string) func() uint64 {
		return func() uint64 { mu.Lock(); defer mu.Unlock(); return seqs[id] }
	}
	stop1, stop2, stop3 := make(chan struct{}), make(chan struct{}), make(chan struct{})
	fakeWorker(t, e.nc, "w1", 50*time.Millisecond, get("w1"), stop1)
	wg2 := fakeWorker(t, e.nc, "w2", 50*time.Millisecond, get("w2"), stop2)
	fakeWorker(t, e.nc, "w3", 50*time.Millisecond, get("w3"), stop3)
	defer close(stop1)
	defer close(stop3)
	// A heartbeat on someone else's subject is ignored.
	spoof, _ := json.Marshal(schemas.WorkerStatus{WorkerID: "w2", AppliedSeq: 99, IntervalMS: 50})
	_ = e.nc.Publish(schemas.StatusSubject("w1"), spoof)
	testenv.WaitFor(t, 5*time.Second, func() bool { return len(w.Live()) == 3 })

	// w3 is already at 9 ≥ 5: it counts with the time of the heartbeat
	// that first showed it, before the call.
	called := time.Now()
	changed := make(chan struct{})
	go func() {
		defer close(changed)
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		seqs["w1"] = 5
		mu.Unlock()
		close(stop2) // w2 dies without applying
		wg2.Wait()
	}()
	defer func() { <-changed }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	applied, missing, err := w.WaitApplied(ctx, 5, []string{"w1", "w2", "w3"})
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 2 || applied["w1"].IsZero() || applied["w3"].IsZero() || !slices.Equal(missing, []string{"w2"}) {
		t.Fatalf("applied %v, missing %v", applied, missing)
	}
	if !applied["w3"].Before(called) || !applied["w1"].After(called.Add(150*time.Millisecond)) {
		t.Fatalf("applied times %v, called at %v", applied, called)
	}
	if elapsed := time.Since(called); elapsed > 3*time.Second {
		t.Fatalf("w2 took %s to count as missing", elapsed)
	}
	for _, st := range w.Live() {
		if st.WorkerID == "w2" {
			t.Fatal("w2 still live")
		}
	}

	// A worker never heard from is missing after the grace period; ctx
	// ending first reports the pending ones as missing, with ctx's error.
	short, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	_, missing, err = w.WaitApplied(short, 100, []string{"w1"})
	if !errors.Is(err, context.DeadlineExceeded) || !slices.Equal(missing, []string{"w1"}) {
		t.Fatalf("ctx end: %v, missing %v", err, missing)
	}
	_, missing, err = w.WaitApplied(ctx, 1, []string{"ghost"})
	if err != nil || !slices.Equal(missing, []string{"ghost"}) {
		t.Fatalf("ghost: %v, missing %v", err, missing)
	}
}

func TestControlDoAndWait(t *testing.T) {
	e := newControlEnv(t)
	sw, err := control.NewStatusWatcher(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	e.startControl(t, "control-a", func(o *control.ControlOptions) { o.Status = sw })

	// A worker that applies whatever TALOS_CONTROL holds, reported by
	// heartbeat.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := e.js.Stream(ctx, schemas.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	fakeWorker(t, e.nc, "w1", 20*time.Millisecond, func() uint64 {
		info, err := st.Info(ctx)
		if err != nil {
			return 0
		}
		return info.State.LastSeq
	}, stop)
	testenv.WaitFor(t, 5*time.Second, func() bool { return len(sw.Live()) == 1 })

	c := e.client()
	r, p, err := c.DoAndWait(ctx, killSwitch(c, "global"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK || r.Seq != 1 || !slices.Equal(r.Workers, []string{"w1"}) {
		t.Fatalf("reply %+v", r)
	}
	if p == nil || p.Seq != 1 || len(p.Applied) != 1 || len(p.Missing) != 0 {
		t.Fatalf("propagation %+v", p)
	}
	if p.Acked.Before(p.Sent) || p.AfterSend() < p.AfterAck() || p.AfterSend() > 5*time.Second {
		t.Fatalf("propagation times: sent %v acked %v after-ack %v after-send %v", p.Sent, p.Acked, p.AfterAck(), p.AfterSend())
	}

	// A live worker that never applies is reported missing when the wait
	// runs out; that is not an error.
	fakeWorker(t, e.nc, "w2", 20*time.Millisecond, func() uint64 { return 0 }, stop)
	testenv.WaitFor(t, 5*time.Second, func() bool { return len(sw.Live()) == 2 })
	r, p, err = c.DoAndWait(ctx, killSwitch(c, "agent:bot-2"), 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK || r.Seq != 2 || p == nil || len(p.Applied) != 1 || p.Applied["w1"].IsZero() || !slices.Equal(p.Missing, []string{"w2"}) {
		t.Fatalf("reply %+v, propagation %+v", r, p)
	}

	// A read has no propagation.
	r, p, err = c.DoAndWait(ctx, c.NewCommand(schemas.VerbStatus), time.Second)
	if err != nil || !r.OK || p != nil {
		t.Fatalf("status: %+v %+v %v", r, p, err)
	}
	// Send folds the outcome into one error: workers that did not confirm,
	// a refusal, or nothing for a read without a wait.
	r, p, err = c.Send(ctx, killSwitch(c, "agent:bot-3"), 500*time.Millisecond)
	var unconfirmed *control.UnconfirmedError
	if !errors.As(err, &unconfirmed) || r == nil || r.Seq != 3 || p == nil || unconfirmed.Seq != 3 ||
		!slices.Equal(unconfirmed.Missing, []string{"w2"}) || !strings.Contains(err.Error(), "1 worker(s) did not confirm seq 3") {
		t.Fatalf("send with a missing worker: %+v %+v %v", r, p, err)
	}
	r, p, err = c.Send(ctx, killSwitch(c, "nowhere:x"), time.Second)
	var refused *control.RefusedError
	if !errors.As(err, &refused) || r == nil || r.OK || p != nil || refused.Reply != r ||
		!strings.HasPrefix(err.Error(), schemas.VerbKillSwitchSet+" refused: ") {
		t.Fatalf("send refused: %+v %+v %v", r, p, err)
	}
	if r, p, err = c.Send(ctx, c.NewCommand(schemas.VerbStatus), 0); err != nil || !r.OK || p != nil {
		t.Fatalf("send status: %+v %+v %v", r, p, err)
	}
}

// TestControlClientRetriesUnrecorded: a CTL_INTERNAL reply that recorded
// nothing (no seq: the service could not reach a stream, say during a
// leader election) is sent again, same bytes and so the same command_id,
// until the service records it; one that names a seq (recorded, a later
// step failed) is returned as it is, never sent again.
func TestControlClientRetriesUnrecorded(t *testing.T) {
	e := newControlEnv(t)
	var (
		mu    sync.Mutex
		seen  [][]byte
		reply = func(n int) schemas.ControlReply {
			if n < 3 {
				return schemas.ControlReply{Code: schemas.CtlInternal, Error: "no stream leader"}
			}
			return schemas.ControlReply{OK: true, Seq: 7, ReceiptID: "r-7"}
		}
	)
	sub, err := e.nc.Subscribe(schemas.SubjectCtlAll, func(m *nats.Msg) {
		mu.Lock()
		seen = append(seen, m.Data)
		r := reply(len(seen))
		mu.Unlock()
		b, _ := json.Marshal(r)
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	c := e.client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := c.Do(ctx, killSwitch(c, "global"))
	if err != nil || !rep.OK || rep.Seq != 7 {
		t.Fatalf("after two unrecorded CTL_INTERNAL: %+v %v, want the third answer", rep, err)
	}
	mu.Lock()
	if len(seen) != 3 || !bytes.Equal(seen[0], seen[1]) || !bytes.Equal(seen[1], seen[2]) {
		t.Fatalf("%d requests, want 3 with the same bytes", len(seen))
	}
	seen = nil
	reply = func(int) schemas.ControlReply {
		return schemas.ControlReply{Code: schemas.CtlInternal, Seq: 8, Error: "recorded at control seq 8, but the replay store was not flushed"}
	}
	mu.Unlock()
	rep, err = c.Do(ctx, killSwitch(c, "global"))
	if err != nil || rep.OK || rep.Seq != 8 {
		t.Fatalf("a recorded CTL_INTERNAL: %+v %v, want it returned", rep, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("a recorded CTL_INTERNAL was sent %d times, want once", len(seen))
	}
}

// TestControlStopsWhenItsCopyCannotResume: the copier's consumer goes away
// with TALOS_CONTROL itself and cannot be bound again (no stream): the
// service stops with an error naming it, where it would otherwise answer
// commands whose events no longer reach the audit trail.
func TestControlStopsWhenItsCopyCannotResume(t *testing.T) {
	e := newControlEnv(t)
	nc, js := testenv.ConnectJS(t, e.url)
	s, err := control.NewControlService(nc, js, control.ControlOptions{
		Chain: receipts.NewChain("control-copy", e.signer), Source: "talos://control/copy", ResponderKeys: e.responders,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	testenv.WaitFor(t, 10*time.Second, func() bool {
		_, err := e.js.Consumer(ctx, schemas.StreamControl, control.ControlAuditConsumer)
		return err == nil
	})
	if err := e.js.DeleteStream(ctx, schemas.StreamControl); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "no longer copied") {
			t.Fatalf("Run: %v, want the copier's error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the control service still runs with its copier stopped for good")
	}
}
