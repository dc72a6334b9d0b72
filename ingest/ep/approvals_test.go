package ep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/natsserver"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// controlSigner signs control receipts the way talosd's control service
// does: in a chain of its own, each naming the TALOS_CONTROL sequence it
// is stored at.
type controlSigner struct {
	t     testing.TB
	key   *receipts.PrivateKey
	chain *receipts.Chain
}

func newControlSigner(t testing.TB) *controlSigner {
	t.Helper()
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return &controlSigner{t: t, key: key, chain: receipts.NewChain("control-test", key)}
}

func (s *controlSigner) keys() verify.KeySet {
	ks := verify.KeySet{}
	ks.Add(s.key.Public())
	return ks
}

// event is the signed control receipt of an accepted verb of target
// stored at seq, with id as its CloudEvent id; edit may change it before
// it is signed.
func (s *controlSigner) event(id string, seq uint64, verb, target string, edit func(*receipts.Meta, *schemas.Receipt)) []byte {
	s.t.Helper()
	cmd := &schemas.ControlCommand{SchemaVersion: schemas.ControlCommandVersion, CommandID: uuid.NewString(), Verb: verb,
		Actor: "alice@host", Reason: "looked at it", IssuedAt: "2030-01-02T03:04:05.000Z", Target: target}
	rec := &schemas.ControlRecord{CommandID: cmd.CommandID, Verb: verb, Actor: cmd.Actor, Reason: cmd.Reason, Target: target,
		Accepted: true, Seq: seq, CommandHash: strings.Repeat("ab", 32), Command: cmd}
	r := &schemas.Receipt{EventType: schemas.KindControl, Tool: verb, Timestamp: "2030-01-02T03:04:05.000Z",
		ResultCode: "accepted", Decision: "allow", Control: rec}
	meta := receipts.Meta{ID: id, Type: schemas.TypeReceiptControl, Source: "talos://control/test", Subject: verb}
	if edit != nil {
		edit(&meta, r)
	}
	sealed, err := s.chain.Seal(meta, r)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.chain.Commit(sealed); err != nil {
		s.t.Fatal(err)
	}
	return sealed.JSON
}

// appendControl stores the event data(seq) on subject as the next
// TALOS_CONTROL sequence, seq.
func appendControl(t testing.TB, js jetstream.JetStream, subject string, data func(seq uint64) []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, schemas.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	last := st.CachedInfo().State.LastSeq
	if _, err := js.Publish(ctx, subject, data(last+1), jetstream.WithExpectLastSequence(last)); err != nil {
		t.Fatalf("append to TALOS_CONTROL at %d: %v", last+1, err)
	}
}

// approvalEnv is an embedded NATS that admits only talosd's users, with
// the streams a worker creates, a worker connection and the NATS user of
// enforcement point "gw".
type approvalEnv struct {
	t      *testing.T
	dir    string
	port   int
	users  *natsauth.File
	ns     *testenv.NATS
	worker *nats.Conn
	wjs    jetstream.JetStream

	mu     sync.Mutex
	epErrs []error // the enforcement point's asynchronous errors
}

func newApprovalEnv(t *testing.T) *approvalEnv {
	t.Helper()
	e := &approvalEnv{t: t, dir: t.TempDir()}
	var err error
	if e.users, _, err = natsauth.Ensure(filepath.Join(e.dir, "nats-auth.json"), []string{"gw"}); err != nil {
		t.Fatal(err)
	}
	e.port = testenv.FreePort(t)
	e.start()
	t.Cleanup(func() { e.ns.Shutdown() })
	w, _ := e.users.Find(schemas.NATSRoleWorker, "")
	e.worker, e.wjs = e.connect(w, nats.ReconnectWait(20*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ingest.EnsureStreams(ctx, e.wjs, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// start (re)starts the server on the same port and store.
func (e *approvalEnv) start() {
	ns, err := testenv.StartNATS(testenv.NATSOptions{Dir: filepath.Join(e.dir, "nats"), Port: e.port, Users: natsserver.Users(e.users)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.ns = ns
}

func (e *approvalEnv) connect(u natsauth.User, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	e.t.Helper()
	nc, err := nats.Connect(e.ns.URL(), append(append(u.ConnectOptions(), nats.MaxReconnects(-1)), opts...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	return nc, js
}

// gateway connects as enforcement point gw and runs Approvals with keys
// over that connection until the test ends; it returns once Ready.
func (e *approvalEnv) gateway(keys verify.KeySet, log *slog.Logger, opts ...nats.Option) (*ep.Approvals, *nats.Conn) {
	e.t.Helper()
	u, _ := e.users.Find(schemas.NATSRoleEnforcement, "gw")
	nc, js := e.connect(u, append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		e.mu.Lock()
		e.epErrs = append(e.epErrs, err)
		e.mu.Unlock()
	}))...)
	e.t.Cleanup(e.noViolations)
	a := ep.NewApprovals(js, ep.ApprovalOptions{Keys: keys, Logger: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	e.t.Cleanup(func() { cancel(); <-done })
	select {
	case <-a.Ready():
	case <-time.After(10 * time.Second):
		e.t.Fatal("Approvals never became ready")
	}
	return a, nc
}

// noViolations fails the test if the server refused the enforcement
// point anything: Approvals needs no right its NATS user lacks.
func (e *approvalEnv) noViolations() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, err := range e.epErrs {
		if errors.Is(err, nats.ErrPermissionViolation) {
			e.t.Errorf("the enforcement point was refused: %v", err)
		}
	}
}

func wantResolution(t *testing.T, ch <-chan ep.Resolution, want ep.Resolution) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("resolution %+v, want %+v", got, want)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no resolution %+v", want)
	}
}

func wantNone(t *testing.T, ch <-chan ep.Resolution, what string) {
	t.Helper()
	select {
	case got := <-ch:
		t.Fatalf("%s resolved: %+v", what, got)
	default:
	}
}

// TestApprovalsRouteByToolCallID: over the enforcement point's own NATS
// user, an accepted approve or reject event in TALOS_CONTROL reaches the
// call parked on its target, and only that call; a refused command, and a
// call no longer expected, get nothing.
func TestApprovalsRouteByToolCallID(t *testing.T) {
	e := newApprovalEnv(t)
	s := newControlSigner(t)
	a, _ := e.gateway(s.keys(), slog.New(slog.DiscardHandler))
	publish := func(id, verb, target string, accepted bool) {
		t.Helper()
		appendControl(t, e.wjs, schemas.ControlSubject(verb), func(seq uint64) []byte {
			return s.event(id, seq, verb, target, func(_ *receipts.Meta, r *schemas.Receipt) {
				if !accepted {
					r.Control.Accepted, r.Control.Command, r.Control.Code = false, nil, schemas.CtlConflict
				}
			})
		})
	}
	approved, rejected, other, marker := a.Expect("call-1"), a.Expect("call-2"), a.Expect("call-3"), a.Expect("call-4")
	publish("ctl-0", schemas.VerbApprove, "call-3", false) // refused by the control service
	publish("ctl-1", schemas.VerbApprove, "call-1", true)
	publish("ctl-2", schemas.VerbReject, "call-2", true)
	publish("ctl-9", schemas.VerbApprove, "call-unknown", true)
	wantResolution(t, approved, ep.Resolution{Verb: schemas.VerbApprove, Actor: "alice@host", ReceiptID: "ctl-1"})
	wantResolution(t, rejected, ep.Resolution{Verb: schemas.VerbReject, Actor: "alice@host", ReceiptID: "ctl-2"})
	a.Forget("call-3")
	publish("ctl-3", schemas.VerbApprove, "call-3", true)
	// Approve events are read in stream order: once call-4's is in,
	// call-3's was handled.
	publish("ctl-4", schemas.VerbApprove, "call-4", true)
	wantResolution(t, marker, ep.Resolution{Verb: schemas.VerbApprove, Actor: "alice@host", ReceiptID: "ctl-4"})
	wantNone(t, other, "a refused command or a forgotten call")
	// The control service never appends a refused command: one in the
	// stream is rejected like any event that is not an accepted one.
	if n := a.Rejected(); n != 1 {
		t.Fatalf("%d events rejected, want the refused command's", n)
	}
}

// TestApprovalsAcrossDisconnect: approve and reject events stored while
// the enforcement point's NATS connection is down (the server restarted
// on the same port and store, and the worker back first) reach their
// parked calls once it reconnects.
func TestApprovalsAcrossDisconnect(t *testing.T) {
	e := newApprovalEnv(t)
	s := newControlSigner(t)
	retried := make(chan struct{}, 1)
	a, epConn := e.gateway(s.keys(), slog.New(slog.DiscardHandler),
		nats.ReconnectWait(3*time.Second), nats.ReconnectJitter(0, 0),
		nats.ReconnectErrHandler(func(*nats.Conn, error) {
			select {
			case retried <- struct{}{}:
			default:
			}
		}))
	approve := func(id, verb, target string) {
		t.Helper()
		appendControl(t, e.wjs, schemas.ControlSubject(verb), func(seq uint64) []byte {
			return s.event(id, seq, verb, target, nil)
		})
	}
	// Before the outage the approve consumer has read an event; the
	// reject consumer has not.
	first := a.Expect("call-0")
	approve("ctl-0", schemas.VerbApprove, "call-0")
	wantResolution(t, first, ep.Resolution{Verb: schemas.VerbApprove, Actor: "alice@host", ReceiptID: "ctl-0"})
	approved, rejected := a.Expect("call-1"), a.Expect("call-2")

	e.ns.Shutdown()
	select {
	case <-retried: // its first reconnect failed: the next is 3 s away
	case <-time.After(10 * time.Second):
		t.Fatal("the enforcement point never tried to reconnect")
	}
	e.start()
	testenv.WaitFor(t, 10*time.Second, e.worker.IsConnected)
	approve("ctl-1", schemas.VerbApprove, "call-1")
	approve("ctl-2", schemas.VerbReject, "call-2")
	if epConn.IsConnected() {
		t.Fatal("the enforcement point reconnected before the events were stored: the test shows nothing")
	}
	wantResolution(t, approved, ep.Resolution{Verb: schemas.VerbApprove, Actor: "alice@host", ReceiptID: "ctl-1"})
	wantResolution(t, rejected, ep.Resolution{Verb: schemas.VerbReject, Actor: "alice@host", ReceiptID: "ctl-2"})
	if n := a.Rejected(); n != 0 {
		t.Fatalf("%d genuine events rejected", n)
	}
}

// TestApprovalsRejectForgedEvents: an event that is not a genuine approve
// or reject of talosd (another key, bytes changed after signing, no
// signature, another receipt type, another verb or subject, a signed seq
// that is not where it is stored) is logged and counted, and never
// releases the call it names; the genuine one after them does.
func TestApprovalsRejectForgedEvents(t *testing.T) {
	e := newApprovalEnv(t)
	s, mallory := newControlSigner(t), newControlSigner(t)
	var logs testenv.SyncBuffer
	a, _ := e.gateway(s.keys(), slog.New(slog.NewTextHandler(&logs, nil)))
	target := a.Expect("call-f")
	approveSubj, rejectSubj := schemas.ControlSubject(schemas.VerbApprove), schemas.ControlSubject(schemas.VerbReject)
	forged := []struct {
		name, subject, why string
		data               func(seq uint64) []byte
	}{
		{"another key", approveSubj, "signature invalid or untrusted (unknown_key)", func(seq uint64) []byte {
			return mallory.event("f-1", seq, schemas.VerbApprove, "call-f", nil)
		}},
		{"changed after signing", approveSubj, "signature invalid or untrusted (bad_signature)", func(seq uint64) []byte {
			return bytes.ReplaceAll(s.event("f-2", seq, schemas.VerbApprove, "call-other", nil), []byte("call-other"), []byte("call-f"))
		}},
		{"no signature", approveSubj, "", func(seq uint64) []byte {
			b, _ := json.Marshal(map[string]any{"id": "f-3", "data": map[string]any{"control": schemas.ControlRecord{
				Verb: schemas.VerbApprove, Actor: "mallory", Target: "call-f", Accepted: true, Seq: seq}}})
			return b
		}},
		{"a decision receipt", approveSubj, "not a control receipt", func(seq uint64) []byte {
			return s.event("f-4", seq, schemas.VerbApprove, "call-f", func(m *receipts.Meta, r *schemas.Receipt) {
				m.Type, r.EventType = schemas.TypeReceiptDecision, schemas.KindDecision
			})
		}},
		{"another verb", approveSubj, "not an approve or reject command", func(seq uint64) []byte {
			return s.event("f-5", seq, schemas.VerbRevoke, "call-f", nil)
		}},
		{"re-published at another seq", approveSubj, "signed seq is not the stream sequence", func(seq uint64) []byte {
			return s.event("f-6", seq-1, schemas.VerbApprove, "call-f", nil)
		}},
		{"approve on the reject subject", rejectSubj, "subject is not the verb's control subject", func(seq uint64) []byte {
			return s.event("f-7", seq, schemas.VerbApprove, "call-f", nil)
		}},
	}
	for _, f := range forged {
		appendControl(t, e.wjs, f.subject, f.data)
	}
	// Each consumer reads in stream order: once both markers are in, every
	// forged event was handled.
	m1, m2 := a.Expect("marker-1"), a.Expect("marker-2")
	appendControl(t, e.wjs, approveSubj, func(seq uint64) []byte { return s.event("ok-1", seq, schemas.VerbApprove, "marker-1", nil) })
	appendControl(t, e.wjs, rejectSubj, func(seq uint64) []byte { return s.event("ok-2", seq, schemas.VerbReject, "marker-2", nil) })
	wantResolution(t, m1, ep.Resolution{Verb: schemas.VerbApprove, Actor: "alice@host", ReceiptID: "ok-1"})
	wantResolution(t, m2, ep.Resolution{Verb: schemas.VerbReject, Actor: "alice@host", ReceiptID: "ok-2"})
	wantNone(t, target, "a forged event")
	if n := a.Rejected(); n != uint64(len(forged)) {
		t.Fatalf("rejected %d events, want %d\n%s", n, len(forged), logs.String())
	}
	out := logs.String()
	if got := strings.Count(out, `msg="approval event rejected"`); got != len(forged) {
		t.Fatalf("%d rejections logged, want %d:\n%s", got, len(forged), out)
	}
	for _, f := range forged {
		if f.why != "" && !strings.Contains(out, f.why) {
			t.Errorf("%s: the log does not say %q:\n%s", f.name, f.why, out)
		}
	}
	appendControl(t, e.wjs, approveSubj, func(seq uint64) []byte { return s.event("ok-3", seq, schemas.VerbApprove, "call-f", nil) })
	wantResolution(t, target, ep.Resolution{Verb: schemas.VerbApprove, Actor: "alice@host", ReceiptID: "ok-3"})
}

// TestApprovalsWithoutKeys: with no talosd key nothing can be verified,
// so Run says so and reads nothing (parked calls time out, fail closed).
func TestApprovalsWithoutKeys(t *testing.T) {
	var logs testenv.SyncBuffer
	a := ep.NewApprovals(nil, ep.ApprovalOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	a.Run(context.Background()) // returns at once: no NATS is touched
	select {
	case <-a.Ready():
	default:
		t.Fatal("not ready without keys")
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "no talosd public key") {
		t.Fatalf("no clear error at start:\n%s", logs.String())
	}
}
