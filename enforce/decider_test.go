package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func newTestDecider(t *testing.T) *Decider {
	t.Helper()
	d, err := NewDecider(testEngine(t, ModeProd), DeciderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDeciderFillsReceipt: the receipt names the call, hashes what was
// received (envelope, request, capability in RFC 8785 form) and carries
// the decision.
func TestDeciderFillsReceipt(t *testing.T) {
	env := envelope("pre", "files", "list_dir", map[string]any{"path": "/"})
	// Keys out of order and spaces: the capability hash is of its canonical form.
	raw, _ := json.Marshal(env)
	raw = append(raw[:len(raw)-1], []byte(`,"capability":{ "z": 1, "constraints": {"read_only": false}, "a": "x" }}`)...)
	now := time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	r, details, _ := newTestDecider(t).Decide("talos.call.pre.gw-1.files", raw, now)
	if r.Decision != schemas.DecisionAllow || len(r.ReasonCodes) != 0 || details != nil {
		t.Fatalf("decision %s %v %v", r.Decision, r.ReasonCodes, details)
	}
	if r.EnvelopeHash != sum(raw) {
		t.Errorf("envelope_hash %s, want sha256 of the bytes received", r.EnvelopeHash)
	}
	if want := sum([]byte(`{"a":"x","constraints":{"read_only":false},"z":1}`)); r.CapabilityHash != want {
		t.Errorf("capability_hash %s, want %s", r.CapabilityHash, want)
	}
	if want := sum([]byte(`{"arguments":{"path":"/"},"name":"list_dir"}`)); r.RequestHash != want {
		t.Errorf("request_hash %s, want %s", r.RequestHash, want)
	}
	if r.EventType != schemas.KindDecision || r.ToolID != "files/list_dir" || r.ToolCallID != testCallID ||
		r.EPID != "gw-1" || r.AgentID != "agent-1" || r.Timestamp != "2026-01-02T03:04:05.006Z" || r.ResultCode != "allow" {
		t.Errorf("receipt fields: %+v", r)
	}
}

// TestDeciderDeniesWhatItCannotTrust: an envelope published on a subject
// it disagrees with, and one that is not JSON, are VAL-HTC-001 and nothing
// else; ids are kept only where they match their patterns.
func TestDeciderDeniesWhatItCannotTrust(t *testing.T) {
	d := newTestDecider(t)
	raw, _ := json.Marshal(envelope("pre", "files", "list_dir", map[string]any{}))
	for _, subject := range []string{"talos.call.pre.gw-1.github", "talos.call.post.gw-1.files"} {
		r, details, _ := d.Decide(subject, raw, time.Now())
		if r.Decision != schemas.DecisionDeny || !slices.Equal(r.ReasonCodes, []string{schemas.CodeEnvelopeInvalid}) || len(details) == 0 {
			t.Errorf("%s: %s %v %v", subject, r.Decision, r.ReasonCodes, details)
		}
		if r.ToolCallID != testCallID || r.ResultCode != schemas.CodeEnvelopeInvalid {
			t.Errorf("%s: tool_call_id %q result_code %q", subject, r.ToolCallID, r.ResultCode)
		}
	}
	r, _, _ := d.Decide("talos.call.post.gw-1.files", []byte("not json"), time.Now())
	if r.Decision != schemas.DecisionDeny || r.Phase != schemas.PhasePost || r.EventType != schemas.KindEffect ||
		r.ServerID != "files" || r.ToolCallID != "" || r.EnvelopeHash != sum([]byte("not json")) {
		t.Errorf("not JSON: %+v", r)
	}
}

// TestDeciderBindsThePublisher: the subject's ep_id is the enforcement
// point that published a call. An envelope naming another is denied
// DENY_EP_ID_MISMATCH alone, with no ledger claim, and its receipt and
// event name the publisher; a malformed envelope's claimed ep_id is
// ignored too; a subject without an ep_id token is VAL-HTC-001 and answers
// no one.
func TestDeciderBindsThePublisher(t *testing.T) {
	l := newCountingLedger()
	d, err := NewDecider(testEngine(t, ModeProd), DeciderOptions{Ledger: l, Redactor: nopRedactor{}})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(envelope("pre", "files", "list_dir", map[string]any{"path": "/"})) // ep_id gw-1
	out, err := d.DecideCall("talos.call.pre.gw-2.files", raw, t0)
	if err != nil {
		t.Fatal(err)
	}
	r := out.Receipt
	if r.Decision != schemas.DecisionDeny || !slices.Equal(r.ReasonCodes, []string{schemas.CodeDenyEPIDMismatch}) ||
		r.ResultCode != schemas.CodeDenyEPIDMismatch {
		t.Fatalf("spoofed ep_id: %s %v", r.Decision, r.ReasonCodes)
	}
	if r.EPID != "gw-2" || r.ToolCallID != testCallID || r.ServerID != "files" || r.ToolID != "files/list_dir" {
		t.Errorf("receipt names %q %q %q, want the publisher gw-2 and the call", r.EPID, r.ToolCallID, r.ToolID)
	}
	if want := sum([]byte(`{"arguments":{"path":"/"},"name":"list_dir"}`)); r.RequestHash != want {
		t.Errorf("request_hash %q, want %q", r.RequestHash, want)
	}
	if len(out.Details) != 1 || !strings.Contains(out.Details[0], `"gw-1"`) || !strings.Contains(out.Details[0], `"gw-2"`) {
		t.Errorf("details %q", out.Details)
	}
	if l.claims.Load() != 0 {
		t.Error("a misattributed call claimed its pair in the ledger")
	}
	if out.ToolCall == nil || out.ToolCall.EPID != "gw-2" || out.ToolCall.Decision != schemas.DecisionDeny {
		t.Errorf("event: %+v", out.ToolCall)
	}
	// The same envelope from its own enforcement point is decided on its merits.
	if r, _, err := d.Decide("talos.call.pre.gw-1.files", raw, t0); err != nil || r.Decision != schemas.DecisionAllow || r.EPID != "gw-1" {
		t.Fatalf("own ep: %v %s %v %q", err, r.Decision, r.ReasonCodes, r.EPID)
	}

	bad := []byte(`{"tool_call_id":"` + testCallID + `","ep_id":"gw-1","phase":"pre"}`)
	r, _, _ = d.Decide("talos.call.pre.gw-2.files", bad, t0)
	if !slices.Equal(r.ReasonCodes, []string{schemas.CodeEnvelopeInvalid}) || r.EPID != "gw-2" || r.ToolCallID != testCallID {
		t.Errorf("malformed: %v ep %q call %q, want VAL-HTC-001 for gw-2", r.ReasonCodes, r.EPID, r.ToolCallID)
	}
	for _, subject := range []string{"talos.call.pre.files", "talos.call.pre.GW.files", "talos.call.pre.gw-1.files.x"} {
		r, details, _ := d.Decide(subject, raw, t0)
		if !slices.Equal(r.ReasonCodes, []string{schemas.CodeEnvelopeInvalid}) || r.EPID != "" || len(details) == 0 {
			t.Errorf("%s: %v ep %q %q", subject, r.ReasonCodes, r.EPID, details)
		}
	}
}

// TestDeciderToolCallIDsPerEnforcementPoint: two enforcement points that
// use the same tool_call_id make two calls: one is not the other's
// redelivery (the second, with the same correlation id, is a replay), and
// a post event is matched to its own enforcement point's pre decision.
func TestDeciderToolCallIDsPerEnforcementPoint(t *testing.T) {
	d, err := NewDecider(testEngine(t, ModeProd), DeciderOptions{Ledger: NewMemLedger(), Redactor: nopRedactor{}})
	if err != nil {
		t.Fatal(err)
	}
	pre, _ := json.Marshal(envelope("pre", "files", "list_dir", map[string]any{"path": "/"}))
	first, err := d.DecideCall("talos.call.pre.gw-1.files", pre, t0)
	if err != nil || first.Receipt.Decision != schemas.DecisionAllow {
		t.Fatalf("gw-1: %v %+v", err, first)
	}
	other := with(envelope("pre", "files", "list_dir", map[string]any{"path": "/"}), "ep_id", "gw-2")
	second, err := d.DecideCall("talos.call.pre.gw-2.files", mustJSON(t, other), t0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(second.Receipt.ReasonCodes, []string{schemas.CodeReplay}) || second.ReceiptID == first.ReceiptID {
		t.Errorf("gw-2 with gw-1's tool_call_id and pair: %v, receipt %s (gw-1's %s)", second.Receipt.ReasonCodes, second.ReceiptID, first.ReceiptID)
	}
	post := func(ep string) *Decided {
		t.Helper()
		env := with(envelope("post", "files", "list_dir", map[string]any{"path": "/"}), "ep_id", ep)
		out, err := d.DecideCall("talos.call.post."+ep+".files", mustJSON(t, env), t0)
		if err != nil || out.ToolCall == nil {
			t.Fatalf("post from %s: %v %+v", ep, err, out)
		}
		return out
	}
	if f := post("gw-1").ToolCall.Flags; len(f) != 0 {
		t.Errorf("gw-1's post: flags %v", f)
	}
	if f := post("gw-2").ToolCall.Flags; !slices.Equal(f, []string{schemas.FlagPostWithoutPre}) {
		t.Errorf("gw-2's post matched gw-1's pre decision: flags %v", f)
	}
}

// TestDeciderUnauthenticatedReport: an enforcement point's report of a
// request it refused for want of credentials (CSP MUST 2) is denied with
// DENY_UNAUTHENTICATED alone, even where capabilities are required and a
// rule set would refuse it otherwise: the receipt says why the request
// was refused, not what it lacked besides.
func TestDeciderUnauthenticatedReport(t *testing.T) {
	pol, err := ParsePolicy([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDecider(testEngine(t, ModeProd), DeciderOptions{Capabilities: capAuthorizer(t), RequireCapability: true, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	env := envelope("pre", schemas.ServerUnauthenticated, "tools/call", map[string]any{"reason": "expired", "source": "192.0.2.7"})
	delete(env["actor"].(map[string]any), "agent_id")
	raw, _ := json.Marshal(env)
	r, details, err := d.Decide("talos.call.pre.gw-1."+schemas.ServerUnauthenticated, raw, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r.Decision != schemas.DecisionDeny || !slices.Equal(r.ReasonCodes, []string{schemas.CodeDenyUnauthenticated}) ||
		r.ResultCode != schemas.CodeDenyUnauthenticated || len(details) != 1 {
		t.Fatalf("got %s %v (result_code %s, details %v), want deny [DENY_UNAUTHENTICATED]", r.Decision, r.ReasonCodes, r.ResultCode, details)
	}
	// The same tool name on an ordinary server is an unknown tool, not an
	// authentication failure.
	env = envelope("pre", "files", "tools/call", map[string]any{})
	raw, _ = json.Marshal(env)
	r, _, err = newTestDecider(t).Decide("talos.call.pre.gw-1.files", raw, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(r.ReasonCodes, schemas.CodeDenyUnauthenticated) {
		t.Fatalf("an ordinary server's call got %v", r.ReasonCodes)
	}
}

// TestDeciderUpstreamSandbox: the decision receipt copies the envelope's
// upstream_sandbox (CSP MUST 8) and has none when the envelope has none.
func TestDeciderUpstreamSandbox(t *testing.T) {
	d := newTestDecider(t)
	digest := "sha256:" + strings.Repeat("ab", 32)
	for name, us := range map[string]*schemas.UpstreamSandbox{
		"no report":  nil,
		"allowlist":  {Sandboxed: true, Network: schemas.SandboxNetworkAllowlist, AllowlistSHA256: digest},
		"unconfined": {Sandboxed: false, Network: schemas.SandboxNetworkUnconfined},
	} {
		t.Run(name, func(t *testing.T) {
			env := envelope("pre", "files", "list_dir", map[string]any{"path": "/"})
			if us != nil {
				env["upstream_sandbox"] = us
			}
			raw, _ := json.Marshal(env)
			r, _, err := d.Decide("talos.call.pre.gw-1.files", raw, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if (r.UpstreamSandbox == nil) != (us == nil) || (us != nil && *r.UpstreamSandbox != *us) {
				t.Fatalf("upstream_sandbox %+v, want %+v (%v)", r.UpstreamSandbox, us, r.ReasonCodes)
			}
			if r.Decision != schemas.DecisionAllow {
				t.Fatalf("decision %s %v, want allow", r.Decision, r.ReasonCodes)
			}
		})
	}
}

// TestDeciderTokenHandling: the receipt records the enforcement point's
// token handling (mode none when it reports none, CSP MUST 5, CRED-03); a
// reported passthrough is DENY_TOKEN_PASSTHROUGH (CRED-02) and a missing
// credential DENY_CREDENTIAL_UNAVAILABLE, in phase pre.
func TestDeciderTokenHandling(t *testing.T) {
	d := newTestDecider(t)
	cases := []struct {
		name  string
		th    map[string]any
		want  schemas.TokenHandling
		codes []string
	}{
		{"no report", nil, schemas.TokenHandling{Mode: schemas.TokenModeNone}, nil},
		{"exchanged", map[string]any{"mode": "token_exchange", "audience": "files", "passthrough_detected": false},
			schemas.TokenHandling{Mode: schemas.TokenModeTokenExchange, Audience: "files"}, nil},
		{"passthrough", map[string]any{"mode": "secret", "audience": "files", "passthrough_detected": true},
			schemas.TokenHandling{Mode: schemas.TokenModeSecret, Audience: "files", PassthroughDetected: true}, []string{schemas.CodeDenyTokenPassthrough}},
		{"endpoint down", map[string]any{"mode": "token_exchange", "audience": "files", "passthrough_detected": false, "error": "endpoint_unreachable"},
			schemas.TokenHandling{Mode: schemas.TokenModeTokenExchange, Audience: "files", Error: schemas.TokenErrEndpointUnreachable},
			[]string{schemas.CodeDenyCredentialUnavailable}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := envelope("pre", "files", "list_dir", map[string]any{"path": "/"})
			if tc.th != nil {
				env["token_handling"] = tc.th
			}
			raw, _ := json.Marshal(env)
			r, _, err := d.Decide("talos.call.pre.gw-1.files", raw, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if r.TokenHandling == nil || *r.TokenHandling != tc.want {
				t.Fatalf("token_handling %+v, want %+v", r.TokenHandling, tc.want)
			}
			for _, c := range []string{schemas.CodeDenyTokenPassthrough, schemas.CodeDenyCredentialUnavailable} {
				if slices.Contains(r.ReasonCodes, c) != slices.Contains(tc.codes, c) {
					t.Fatalf("reason codes %v, want %v among them", r.ReasonCodes, tc.codes)
				}
			}
			if len(tc.codes) > 0 && r.Decision != schemas.DecisionDeny {
				t.Fatalf("decision %s, want deny", r.Decision)
			}
		})
	}
}
