package ep_test

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestApprovalsRouteByToolCallID: an accepted approve or reject event
// reaches the call parked on its target, and only that call; a refused
// command, and a call no longer expected, get nothing.
func TestApprovalsRouteByToolCallID(t *testing.T) {
	nc, _ := testenv.ConnectJS(t, testenv.NATSForTest(t).URL())
	a := ep.NewApprovals(nc, slog.New(slog.DiscardHandler))
	a.Start()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	publish := func(id, verb, target string, accepted bool) {
		t.Helper()
		ev := map[string]any{"id": id, "data": map[string]any{"control": schemas.ControlRecord{
			Verb: verb, Actor: "alice@host", Target: target, Accepted: accepted}}}
		b, _ := json.Marshal(ev)
		if err := nc.Publish(schemas.ControlSubject(verb), b); err != nil {
			t.Fatal(err)
		}
	}
	approved, rejected, other := a.Expect("call-1"), a.Expect("call-2"), a.Expect("call-3")
	publish("ctl-0", schemas.VerbApprove, "call-3", false) // refused by the control service
	publish("ctl-1", schemas.VerbApprove, "call-1", true)
	publish("ctl-2", schemas.VerbReject, "call-2", true)
	publish("ctl-9", schemas.VerbApprove, "call-unknown", true)
	for ch, want := range map[<-chan ep.Resolution]ep.Resolution{
		approved: {Verb: schemas.VerbApprove, Actor: "alice@host", ReceiptID: "ctl-1"},
		rejected: {Verb: schemas.VerbReject, Actor: "alice@host", ReceiptID: "ctl-2"},
	} {
		select {
		case got := <-ch:
			if got != want {
				t.Fatalf("resolution %+v, want %+v", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no resolution %+v", want)
		}
	}
	a.Forget("call-3")
	publish("ctl-3", schemas.VerbApprove, "call-3", true)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-other:
		t.Fatalf("a refused command or a forgotten call resolved: %+v", got)
	case <-time.After(200 * time.Millisecond):
	}
}
