package ep_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// clientEnv is an embedded NATS with the streams, a client for
// enforcement point gw-1, and a connection that plays the worker.
type clientEnv struct {
	client *ep.Client
	nc     *nats.Conn
	js     jetstream.JetStream
	worker *nats.Conn
}

func newClientEnv(t *testing.T) *clientEnv {
	t.Helper()
	ns := testenv.NATSForTest(t)
	nc, js := testenv.ConnectJS(t, ns.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	client, err := ep.NewClient(nc, js, "gw-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	worker, _ := testenv.ConnectJS(t, ns.URL())
	return &clientEnv{client: client, nc: nc, js: js, worker: worker}
}

// answer makes the worker connection answer each call published on
// enforcement point gw-1's subjects with the decisions of reply, in
// order.
func (e *clientEnv) answer(t *testing.T, reply func(call *schemas.ToolCall) []schemas.Decision) {
	t.Helper()
	sub, err := e.worker.Subscribe(schemas.EPCallSubjects("gw-1"), func(m *nats.Msg) {
		var call schemas.ToolCall
		if json.Unmarshal(m.Data, &call) != nil {
			return
		}
		for _, d := range reply(&call) {
			b, _ := json.Marshal(d)
			_ = e.worker.Publish(schemas.DecisionSubject("gw-1", call.Phase, call.ToolCallID), b)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.worker.Flush(); err != nil {
		t.Fatal(err)
	}
}

// decision is a decision on call whose receipt names requestHash.
func decision(call *schemas.ToolCall, verdict string, codes []string, requestHash string) schemas.Decision {
	receipt, _ := json.Marshal(map[string]any{"data": map[string]any{"request_hash": requestHash, "ep_id": "gw-1"}})
	return schemas.Decision{ToolCallID: call.ToolCallID, Phase: call.Phase, Decision: verdict, ReasonCodes: codes,
		ReceiptID: "r-" + verdict, Receipt: receipt}
}

// TestClientTakesOnlyItsRequestsDecision: a decision on the call's
// tool_call_id and phase is taken only if its receipt names the hash of
// the request the client sent; a receipt without one only as the
// VAL-HTC-001 deny it can be. Anything else is ignored, and the call
// ends without a decision (fail closed).
func TestClientTakesOnlyItsRequestsDecision(t *testing.T) {
	e := newClientEnv(t)
	const otherHash = "0000000000000000000000000000000000000000000000000000000000000000"
	e.answer(t, func(call *schemas.ToolCall) []schemas.Decision {
		own := ep.RequestHashOf(mustMarshal(t, call))
		switch call.Request.Name {
		case "read_file": // another request's allow, then this one's deny
			return []schemas.Decision{decision(call, schemas.DecisionAllow, []string{}, otherHash),
				decision(call, schemas.DecisionDeny, []string{schemas.CodeKillSwitch}, own)}
		case "list_directory": // another request's allow only
			return []schemas.Decision{decision(call, schemas.DecisionAllow, []string{}, otherHash)}
		case "unreadable": // no request hash: an allow is not taken, a VAL-HTC-001 deny is
			return []schemas.Decision{decision(call, schemas.DecisionAllow, []string{}, ""),
				decision(call, schemas.DecisionDeny, []string{schemas.CodeEnvelopeInvalid}, "")}
		}
		return nil
	})
	call := func(tool string, wait time.Duration) (*schemas.Decision, error) {
		c, err := ep.NewCall("gw-1", "files", tool, map[string]any{"path": "a"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		return e.client.Call(ctx, c)
	}
	d, err := call("read_file", 10*time.Second)
	if err != nil || d.Decision != schemas.DecisionDeny || d.ReasonCodes[0] != schemas.CodeKillSwitch {
		t.Fatalf("read_file: %+v %v, want its own deny, not the other request's allow", d, err)
	}
	if d, err := call("list_directory", time.Second); !errors.Is(err, ep.ErrNoDecision) {
		t.Fatalf("list_directory: %+v %v, want %v", d, err, ep.ErrNoDecision)
	}
	d, err = call("unreadable", 10*time.Second)
	if err != nil || d.Decision != schemas.DecisionDeny || d.ReasonCodes[0] != schemas.CodeEnvelopeInvalid {
		t.Fatalf("unreadable: %+v %v, want the VAL-HTC-001 deny", d, err)
	}
}

// TestClientPublishesOnItsOwnSubject: a call goes out on
// talos.call.<phase>.<ep_id>.<server_id> with Nats-Msg-Id
// <ep_id>:<tool_call_id>:<phase>:<digest>, whatever ep_id its envelope
// names.
func TestClientPublishesOnItsOwnSubject(t *testing.T) {
	e := newClientEnv(t)
	call, _ := ep.NewCall("gw-2", "files", "read_file", map[string]any{"path": "a"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.client.Publish(ctx, call.Phase, call.ServerID, call.ToolCallID, mustMarshal(t, call)); err != nil {
		t.Fatal(err)
	}
	s, err := e.js.Stream(ctx, schemas.StreamCalls)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, "talos.call.pre.gw-1.files")
	if err != nil {
		t.Fatalf("no call on gw-1's subject: %v", err)
	}
	if got, want := m.Header.Get(jetstream.MsgIDHeader), schemas.CallMsgID("gw-1", call.ToolCallID, schemas.PhasePre, m.Data); got != want || !strings.HasPrefix(got, "gw-1:"+call.ToolCallID+":pre:") {
		t.Fatalf("Nats-Msg-Id %q, want %q", got, want)
	}

	// A Prepared envelope goes out with the Nats-Msg-Id its caller
	// derived, as given (no worker answers here: no decision).
	next, _ := ep.NewCall("gw-1", "files", "read_file", map[string]any{"path": "b"})
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer pcancel()
	id := "gw-1:" + next.ToolCallID + ":pre:prepared"
	if _, err := e.client.SendPrepared(pctx, &ep.Prepared{Phase: next.Phase, ServerID: "files", ToolCallID: next.ToolCallID, MsgID: id, Raw: mustMarshal(t, next)}); !errors.Is(err, ep.ErrNoDecision) {
		t.Fatalf("send prepared without a worker: %v, want %v", err, ep.ErrNoDecision)
	}
	if m, err = s.GetLastMsgForSubject(ctx, "talos.call.pre.gw-1.files"); err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get(jetstream.MsgIDHeader); got != id {
		t.Fatalf("prepared call stored with Nats-Msg-Id %q, want %q", got, id)
	}
}

// TestClientDuplicateOfACallItNeverSent: a call whose Nats-Msg-Id the
// stream already holds from another publisher is ErrDuplicateCall, not
// taken for sent; the client's own retry of a publish is fine.
func TestClientDuplicateOfACallItNeverSent(t *testing.T) {
	e := newClientEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call, _ := ep.NewCall("gw-1", "files", "read_file", map[string]any{"path": "a"})
	raw := mustMarshal(t, call)
	first := &nats.Msg{Subject: schemas.CallSubject(schemas.PhasePre, "gw-1", "files"), Data: []byte(`{}`), Header: nats.Header{}}
	first.Header.Set(jetstream.MsgIDHeader, schemas.CallMsgID("gw-1", call.ToolCallID, schemas.PhasePre, raw))
	wjs, _ := jetstream.New(e.worker)
	if _, err := wjs.PublishMsg(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := e.client.Publish(ctx, call.Phase, call.ServerID, call.ToolCallID, raw); !errors.Is(err, ep.ErrDuplicateCall) {
		t.Fatalf("publish of a call another publisher's message holds: %v, want %v", err, ep.ErrDuplicateCall)
	}
	if _, err := e.client.Call(ctx, call); !errors.Is(err, ep.ErrDuplicateCall) || !strings.Contains(err.Error(), "fail closed") {
		t.Fatalf("call: %v, want %v", err, ep.ErrDuplicateCall)
	}
	own, _ := ep.NewCall("gw-1", "files", "read_file", map[string]any{"path": "b"})
	for i := range 2 {
		if err := e.client.Publish(ctx, own.Phase, own.ServerID, own.ToolCallID, mustMarshal(t, own)); err != nil {
			t.Fatalf("publish #%d of its own call: %v", i+1, err)
		}
	}
}

// TestClientAsksAgain: a call whose decision reply the client never
// received (the worker answered while it was away) gets the decision
// TALOS_DECISIONS keeps for it, on the same terms as a live one: another
// request's decision stored for the call is not taken, and a call nothing
// was stored for is ErrNoDecision once its deadline passes.
func TestClientAsksAgain(t *testing.T) {
	e := newClientEnv(t)
	client, err := ep.NewClientWithOptions(e.nc, e.js, "gw-1", ep.ClientOptions{ReaskAfter: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	wjs, _ := jetstream.New(e.worker)
	// store keeps a decision on call in TALOS_DECISIONS, published before
	// the call is sent: no live reply can reach its waiter.
	store := func(call *schemas.ToolCall, verdict, requestHash string) {
		d := decision(call, verdict, []string{}, requestHash)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := wjs.Publish(ctx, schemas.DecisionSubject("gw-1", call.Phase, call.ToolCallID), mustMarshal(t, d)); err != nil {
			t.Fatal(err)
		}
	}
	send := func(call *schemas.ToolCall, wait time.Duration) (*schemas.Decision, time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		began := time.Now()
		d, err := client.Call(ctx, call)
		return d, time.Since(began), err
	}
	missed, _ := ep.NewCall("gw-1", "files", "read_file", map[string]any{"path": "a"})
	store(missed, schemas.DecisionAllow, ep.RequestHashOf(mustMarshal(t, missed)))
	d, took, err := send(missed, 10*time.Second)
	if err != nil || d.Decision != schemas.DecisionAllow || d.ReceiptID != "r-allow" {
		t.Fatalf("missed decision: %+v %v, want the stored allow", d, err)
	}
	t.Logf("missed decision obtained by asking again after %v", took.Round(time.Millisecond))

	other, _ := ep.NewCall("gw-1", "files", "read_file", map[string]any{"path": "b"})
	store(other, schemas.DecisionAllow, "0000000000000000000000000000000000000000000000000000000000000000")
	if d, _, err := send(other, time.Second); !errors.Is(err, ep.ErrNoDecision) {
		t.Fatalf("another request's stored allow: %+v %v, want %v", d, err, ep.ErrNoDecision)
	}
	never, _ := ep.NewCall("gw-1", "files", "read_file", map[string]any{"path": "c"})
	if d, _, err := send(never, time.Second); !errors.Is(err, ep.ErrNoDecision) {
		t.Fatalf("a call never decided: %+v %v, want %v", d, err, ep.ErrNoDecision)
	}
	// The refusal is recorded: the call's post event names DECISION_TIMEOUT.
	if err := client.RecordNoDecision(never, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	calls, err := e.js.Stream(ctx, schemas.StreamCalls)
	if err != nil {
		t.Fatal(err)
	}
	m, err := calls.GetLastMsgForSubject(ctx, schemas.CallSubject(schemas.PhasePost, "gw-1", "files"))
	if err != nil {
		t.Fatal(err)
	}
	var post schemas.ToolCall
	if err := json.Unmarshal(m.Data, &post); err != nil || post.ToolCallID != never.ToolCallID || post.Error == nil ||
		post.Error.Code != schemas.CodeDecisionTimeout || post.Error.Kind != "denied" || post.Result != nil {
		t.Fatalf("post event %s (%v), want the call's DECISION_TIMEOUT", m.Data, err)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
