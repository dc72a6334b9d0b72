package loadgen

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/tracing"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// The prepared envelopes are what `talosctl call` would send: valid
// envelopes with fresh ids, the run's session, the request_hash of their
// request and, with a signer, the chain and a sender signature; a post
// event answers its own pre call.
func TestBenchEnvelopes(t *testing.T) {
	m := &Maker{Server: "files", Tool: "list_directory", Session: "bench-test", Args: json.RawMessage(`{"path":"bench/x"}`), Post: true}
	seen := map[string]bool{}
	for i := range 20 {
		env, err := m.make("bench-test-ep")
		if err != nil {
			t.Fatal(err)
		}
		pre, err := schemas.ParseToolCall(env.pre, schemas.Limits{})
		if err != nil {
			t.Fatalf("pre %d: %v\n%s", i, err, env.pre)
		}
		post, err := schemas.ParseToolCall(env.post, schemas.Limits{})
		if err != nil {
			t.Fatalf("post %d: %v\n%s", i, err, env.post)
		}
		c, p := &pre.Call, &post.Call
		for _, id := range []string{c.ToolCallID, c.TraceID, c.CorrelationID} {
			if seen[id] {
				t.Fatalf("envelope %d reuses id %s", i, id)
			}
			seen[id] = true
		}
		if env.toolCallID != c.ToolCallID || c.Phase != schemas.PhasePre || c.SessionID != "bench-test" || c.EPID != "bench-test-ep" {
			t.Fatalf("pre %d: %+v", i, c)
		}
		if p.Phase != schemas.PhasePost || p.ToolCallID != c.ToolCallID || p.CorrelationID != c.CorrelationID || p.Timing == nil || p.OK == nil || !*p.OK {
			t.Fatalf("post %d does not answer its pre call: %+v", i, p)
		}
		// The Nats-Msg-Ids built with them are the ones the client would
		// derive from the bytes it sends.
		if want := schemas.CallMsgID("bench-test-ep", c.ToolCallID, schemas.PhasePre, env.pre); env.preID != want {
			t.Fatalf("pre %d: Nats-Msg-Id %q, want %q", i, env.preID, want)
		}
		if want := schemas.CallMsgID("bench-test-ep", p.ToolCallID, schemas.PhasePost, env.post); env.postID != want {
			t.Fatalf("post %d: Nats-Msg-Id %q, want %q", i, env.postID, want)
		}
	}

	// Traced: each call names a parent span of its own trace, which the
	// post event repeats.
	m.Traced = true
	env, err := m.make("bench-test-ep")
	if err != nil {
		t.Fatal(err)
	}
	pre, _ := schemas.ParseToolCall(env.pre, schemas.Limits{})
	post, _ := schemas.ParseToolCall(env.post, schemas.Limits{})
	if pre == nil || post == nil {
		t.Fatal("a traced envelope does not parse")
	}
	if _, ok := tracing.Remote(pre.Call.TraceID, pre.Call.ParentSpanID); !ok || seen[pre.Call.TraceID] {
		t.Fatalf("traced pre names no fresh parent span: %q %q", pre.Call.TraceID, pre.Call.ParentSpanID)
	}
	if post.Call.TraceID != pre.Call.TraceID || post.Call.ParentSpanID != pre.Call.ParentSpanID {
		t.Fatal("the post event is not in its pre call's trace")
	}
	m.Traced = false

	// With a signer: the chain, the request_hash and a sender signature.
	issuer, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	agent, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	m.Signer = newTestCallSigner(t, issuer, agent)
	env, err = m.make("bench-test-ep")
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range [][]byte{env.pre, env.post} {
		pc, err := schemas.ParseToolCall(raw, schemas.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		req, err := jsonkit.MarshalCanonical(pc.Call.Request)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(req)
		if pc.Call.RequestHash != hex.EncodeToString(sum[:]) || pc.Doc["capability"] == nil || pc.Doc["sender_signature"] == nil ||
			pc.Call.Actor.AgentID != "bench-agent" {
			t.Fatalf("signed %s envelope: %s", pc.Call.Phase, raw)
		}
	}
}

// newTestCallSigner issues a capability over tool:files:* to "bench-agent"
// and returns a signer holding it.
func newTestCallSigner(t *testing.T, issuer, agent *receipts.PrivateKey) *ep.CallSigner {
	t.Helper()
	now := time.Now().UTC()
	c, err := enforce.IssueCapability(issuer, schemas.Capability{
		CapabilityID: "cap-bench-test", Issuer: "test-issuer", Subject: "bench-agent",
		SubjectPublicKey: enforce.PublicKeyString(agent.Public()), Scopes: []string{"tool:files:*"},
		IssuedAt: now.Format(schemas.TimeFormat), ExpiresAt: now.Add(time.Hour).Format(schemas.TimeFormat),
	})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(schemas.CapabilityChain{Capability: c})
	if err != nil {
		t.Fatal(err)
	}
	s, err := ep.NewCallSigner(raw, agent)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The queues hand every enforcement point its envelopes in order, keep at
// most depth ready before the clock starts, and stop cleanly part-way.
func TestBenchEnvelopeQueues(t *testing.T) {
	m := &Maker{Server: "files", Tool: "list_directory", Session: "bench-test", Args: json.RawMessage(`{"path":"x"}`)}
	counts := splitCalls(23, 4)
	if !slices.Equal(counts, []int{6, 6, 6, 5}) {
		t.Fatalf("splitCalls(23, 4) = %v", counts)
	}
	eps := []string{"ep-0", "ep-1", "ep-2", "ep-3"}

	all := startEnvelopes(m, eps, counts, slices.Max(counts))
	if n, err := all.ready(); n != 23 || err != nil {
		t.Fatalf("all ahead: %d ready (%v), want 23", n, err)
	}
	for i, q := range all.q {
		got := 0
		for env := range q {
			var c schemas.ToolCall
			if err := json.Unmarshal(env.pre, &c); err != nil || c.EPID != eps[i] {
				t.Fatalf("queue %d got %s (%v)", i, env.pre, err)
			}
			got++
		}
		if got != counts[i] {
			t.Fatalf("queue %d: %d envelopes, want %d", i, got, counts[i])
		}
	}
	all.stop()

	// Two ahead per queue: 8 ready, the rest made as they are taken.
	some := startEnvelopes(m, eps, counts, 2)
	if n, err := some.ready(); n != 8 || err != nil {
		t.Fatalf("two ahead: %d ready (%v), want 8", n, err)
	}
	<-some.q[0]
	done := make(chan struct{})
	go func() { some.stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stop did not end the producers")
	}

	// A build error closes the queue early and is reported.
	bad := &Maker{Server: "files", Tool: "list_directory", Session: "bench-test", Args: json.RawMessage(`{`)}
	q := startEnvelopes(bad, eps[:1], []int{3}, 3)
	if _, err := q.ready(); err == nil {
		t.Fatal("a broken envelope was not reported")
	}
	if _, open := <-q.q[0]; open {
		t.Fatal("the failed queue still hands out envelopes")
	}
	q.stop()
	if err := q.failed(); err == nil || !strings.Contains(err.Error(), "arguments") {
		t.Fatalf("failed() after stop: %v", err)
	}
}
