package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
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
	r, details, _ := newTestDecider(t).Decide("talos.call.pre.files", raw, now)
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
	for _, subject := range []string{"talos.call.pre.github", "talos.call.post.files"} {
		r, details, _ := d.Decide(subject, raw, time.Now())
		if r.Decision != schemas.DecisionDeny || !slices.Equal(r.ReasonCodes, []string{schemas.CodeEnvelopeInvalid}) || len(details) == 0 {
			t.Errorf("%s: %s %v %v", subject, r.Decision, r.ReasonCodes, details)
		}
		if r.ToolCallID != testCallID || r.ResultCode != schemas.CodeEnvelopeInvalid {
			t.Errorf("%s: tool_call_id %q result_code %q", subject, r.ToolCallID, r.ResultCode)
		}
	}
	r, _, _ := d.Decide("talos.call.post.files", []byte("not json"), time.Now())
	if r.Decision != schemas.DecisionDeny || r.Phase != schemas.PhasePost || r.EventType != schemas.KindEffect ||
		r.ServerID != "files" || r.ToolCallID != "" || r.EnvelopeHash != sum([]byte("not json")) {
		t.Errorf("not JSON: %+v", r)
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
	r, details, err := d.Decide("talos.call.pre."+schemas.ServerUnauthenticated, raw, time.Now())
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
	r, _, err = newTestDecider(t).Decide("talos.call.pre.files", raw, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(r.ReasonCodes, schemas.CodeDenyUnauthenticated) {
		t.Fatalf("an ordinary server's call got %v", r.ReasonCodes)
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
			r, _, err := d.Decide("talos.call.pre.files", raw, time.Now())
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
