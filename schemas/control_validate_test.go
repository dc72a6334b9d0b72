package schemas

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

var validateNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func baseCommand(verb string) *ControlCommand {
	return &ControlCommand{
		SchemaVersion: ControlCommandVersion,
		CommandID:     "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e",
		Verb:          verb,
		Actor:         "alice",
		IssuedAt:      validateNow.Add(-time.Second).Format(TimeFormat),
	}
}

func TestControlCommandValidate(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	cases := []struct {
		name     string
		cmd      func() *ControlCommand
		code     string
		mentions string // the message must name this
	}{
		{"killswitch.set global", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchSet)
			c.Scope, c.Reason = ScopeGlobal, "incident 42"
			return c
		}, "", ""},
		{"killswitch.clear tool scope", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchClear)
			c.Scope, c.Reason = "tool:github/create_issue", "resolved"
			return c
		}, "", ""},
		{"killswitch.set without scope", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchSet)
			c.Reason = "x"
			return c
		}, CtlInvalid, "scope"},
		{"killswitch.set bad scope", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchSet)
			c.Scope, c.Reason = "server:Bad Server", "x"
			return c
		}, CtlInvalid, "scope"},
		{"killswitch.set without reason", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchSet)
			c.Scope = ScopeGlobal
			return c
		}, CtlInvalid, "reason"},
		{"killswitch.clear blank reason", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchClear)
			c.Scope, c.Reason = ScopeGlobal, "   "
			return c
		}, CtlInvalid, "reason"},
		{"quarantine.set", func() *ControlCommand {
			c := baseCommand(VerbQuarantineSet)
			c.SessionID, c.Reason = "sess-1", "exfil"
			return c
		}, "", ""},
		{"quarantine.set without session", func() *ControlCommand {
			c := baseCommand(VerbQuarantineSet)
			c.Reason = "exfil"
			return c
		}, CtlInvalid, "session_id"},
		{"quarantine.clear without reason", func() *ControlCommand {
			c := baseCommand(VerbQuarantineClear)
			c.SessionID = "sess-1"
			return c
		}, CtlInvalid, "reason"},
		{"revoke", func() *ControlCommand {
			c := baseCommand(VerbRevoke)
			c.Target, c.Reason = "agent:bot-7", "compromised"
			return c
		}, "", ""},
		{"revoke without target", func() *ControlCommand {
			c := baseCommand(VerbRevoke)
			c.Reason = "compromised"
			return c
		}, CtlInvalid, "target"},
		{"revoke without reason", func() *ControlCommand {
			c := baseCommand(VerbRevoke)
			c.Target = "cap-1"
			return c
		}, CtlInvalid, "reason"},
		{"registry.publish", func() *ControlCommand {
			c := baseCommand(VerbRegistryPublish)
			c.Manifests = []json.RawMessage{json.RawMessage(`{"server_id":"github"}`)}
			return c
		}, "", ""},
		{"registry.publish without manifests", func() *ControlCommand {
			return baseCommand(VerbRegistryPublish)
		}, CtlInvalid, "manifests"},
		{"registry.publish manifest not an object", func() *ControlCommand {
			c := baseCommand(VerbRegistryPublish)
			c.Manifests = []json.RawMessage{json.RawMessage(`[1]`)}
			return c
		}, CtlInvalid, "manifests[0]"},
		{"registry.pin", func() *ControlCommand {
			c := baseCommand(VerbRegistryPin)
			c.Digest = digest
			return c
		}, "", ""},
		{"registry.pin without digest", func() *ControlCommand {
			return baseCommand(VerbRegistryPin)
		}, CtlInvalid, "digest"},
		{"registry.pin uppercase digest", func() *ControlCommand {
			c := baseCommand(VerbRegistryPin)
			c.Digest = strings.ToUpper(digest[:7]) + strings.ToUpper(digest[7:])
			return c
		}, CtlInvalid, "digest"},
		{"registry.pin short digest", func() *ControlCommand {
			c := baseCommand(VerbRegistryPin)
			c.Digest = "sha256:abcd"
			return c
		}, CtlInvalid, "digest"},
		{"replay.check", func() *ControlCommand {
			c := baseCommand(VerbReplayCheck)
			c.SessionID, c.CorrelationID = "sess-1", "q3V2bH7pR9sT1uW4xY6zAb"
			return c
		}, "", ""},
		{"replay.check without correlation", func() *ControlCommand {
			c := baseCommand(VerbReplayCheck)
			c.SessionID = "sess-1"
			return c
		}, CtlInvalid, "correlation_id"},
		{"replay.check without session", func() *ControlCommand {
			c := baseCommand(VerbReplayCheck)
			c.CorrelationID = "q3V2bH7pR9sT1uW4xY6zAb"
			return c
		}, CtlInvalid, "session_id"},
		{"replay.flush all sessions", func() *ControlCommand {
			c := baseCommand(VerbReplayFlush)
			c.Reason = "rotation"
			return c
		}, "", ""},
		{"replay.flush without reason", func() *ControlCommand {
			return baseCommand(VerbReplayFlush)
		}, CtlInvalid, "reason"},
		{"killswitch.set egress global", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchSet)
			c.Scope, c.Reason = "egress:global", "exfiltration"
			return c
		}, "", ""},
		{"killswitch.set egress session", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchSet)
			c.Scope, c.Reason = "egress:session:sess-1", "exfiltration"
			return c
		}, "", ""},
		{"killswitch.clear egress agent", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchClear)
			c.Scope, c.Reason = "egress:agent:bot-7", "resolved"
			return c
		}, "", ""},
		{"killswitch.set egress server is no egress scope", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchSet)
			c.Scope, c.Reason = "egress:server:files", "x"
			return c
		}, CtlInvalid, "scope"},
		{"killswitch.set egress without id", func() *ControlCommand {
			c := baseCommand(VerbKillSwitchSet)
			c.Scope, c.Reason = "egress:session:", "x"
			return c
		}, CtlInvalid, "scope"},
		{"approve without reason", func() *ControlCommand {
			c := baseCommand(VerbApprove)
			c.Target = "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f"
			return c
		}, "", ""},
		{"approve without target", func() *ControlCommand {
			return baseCommand(VerbApprove)
		}, CtlInvalid, "target"},
		{"approve of no uuid", func() *ControlCommand {
			c := baseCommand(VerbApprove)
			c.Target = "call-1"
			return c
		}, CtlInvalid, "tool_call_id"},
		{"reject", func() *ControlCommand {
			c := baseCommand(VerbReject)
			c.Target, c.Reason = "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f", "not during the freeze"
			return c
		}, "", ""},
		{"reject without reason", func() *ControlCommand {
			c := baseCommand(VerbReject)
			c.Target = "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f"
			return c
		}, CtlInvalid, "reason"},
		{"reads need nothing", func() *ControlCommand { return baseCommand(VerbStatus) }, "", ""},
		{"killswitch.list", func() *ControlCommand { return baseCommand(VerbKillSwitchList) }, "", ""},
		{"unknown verb", func() *ControlCommand { return baseCommand("killswitch.toggle") }, CtlUnknownVerb, "killswitch.toggle"},
		{"wrong schema version", func() *ControlCommand {
			c := baseCommand(VerbStatus)
			c.SchemaVersion = "talos.control_command.v2"
			return c
		}, CtlInvalid, "schema_version"},
		{"command id not a uuid", func() *ControlCommand {
			c := baseCommand(VerbStatus)
			c.CommandID = "cmd-1"
			return c
		}, CtlInvalid, "command_id"},
		{"no actor", func() *ControlCommand {
			c := baseCommand(VerbStatus)
			c.Actor = ""
			return c
		}, CtlInvalid, "actor"},
		{"reason too long", func() *ControlCommand {
			c := baseCommand(VerbReplayFlush)
			c.Reason = strings.Repeat("r", 1025)
			return c
		}, CtlInvalid, "reason"},
		{"issued_at not a time", func() *ControlCommand {
			c := baseCommand(VerbStatus)
			c.IssuedAt = "yesterday"
			return c
		}, CtlInvalid, "issued_at"},
		{"stale", func() *ControlCommand {
			c := baseCommand(VerbStatus)
			c.IssuedAt = validateNow.Add(-6 * time.Minute).Format(TimeFormat)
			return c
		}, CtlStale, "issued_at"},
		{"from the future", func() *ControlCommand {
			c := baseCommand(VerbStatus)
			c.IssuedAt = validateNow.Add(6 * time.Minute).Format(TimeFormat)
			return c
		}, CtlStale, "issued_at"},
		{"offset time inside window", func() *ControlCommand {
			c := baseCommand(VerbStatus)
			c.IssuedAt = validateNow.In(time.FixedZone("x", 2*3600)).Format(time.RFC3339)
			return c
		}, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, err := tc.cmd().Validate(validateNow, 5*time.Minute)
			if code != tc.code {
				t.Fatalf("code %q (%v), want %q", code, err, tc.code)
			}
			if (err == nil) != (tc.code == "") {
				t.Fatalf("code %q with error %v", code, err)
			}
			if err != nil && !strings.Contains(err.Error(), tc.mentions) {
				t.Fatalf("error %q does not name %q", err, tc.mentions)
			}
		})
	}
}

func TestControlCommandValidateSkewDefault(t *testing.T) {
	c := baseCommand(VerbStatus)
	c.IssuedAt = validateNow.Add(-4 * time.Minute).Format(TimeFormat)
	if code, err := c.Validate(validateNow, 0); code != "" {
		t.Fatalf("4 min old with the default window: %s %v", code, err)
	}
	if code, _ := c.Validate(validateNow, time.Minute); code != CtlStale {
		t.Fatalf("4 min old with a 1 min window: %q, want %s", code, CtlStale)
	}
}

func TestDecodeControlCommand(t *testing.T) {
	good := `{"schema_version":"talos.control_command.v1","command_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","verb":"status","actor":"a","issued_at":"2026-03-01T12:00:00.000Z"}`
	cmd, err := DecodeControlCommand([]byte(good), 0)
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Verb != "status" || cmd.Actor != "a" {
		t.Fatalf("decoded %+v", cmd)
	}
	bad := map[string]string{
		"not json":          `hello`,
		"array":             `[1,2]`,
		"string":            `"status"`,
		"unknown field":     strings.Replace(good, `"actor"`, `"actress"`, 1),
		"case folded field": strings.Replace(good, `"actor"`, `"Actor"`, 1),
		"duplicate key":     strings.Replace(good, `}`, `,"verb":"revoke"}`, 1),
		"trailing data":     good + ` {}`,
		"wrong type":        strings.Replace(good, `"actor":"a"`, `"actor":7`, 1),
		"unknown sig field": strings.Replace(good, `}`, `,"signature":{"alg":"Ed25519","kid":"k","sig":"s","x":1}}`, 1),
		"invalid utf-8":     strings.Replace(good, `"a"`, "\"\xff\"", 1),
	}
	for name, in := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeControlCommand([]byte(in), 0)
			if !errors.Is(err, ErrControlMalformed) {
				t.Fatalf("err %v, want ErrControlMalformed", err)
			}
		})
	}
	if _, err := DecodeControlCommand([]byte(good), 64); !errors.Is(err, ErrControlMalformed) {
		t.Fatalf("over the size bound: %v", err)
	}
}

func FuzzDecodeControlCommand(f *testing.F) {
	f.Add([]byte(`{"schema_version":"talos.control_command.v1","command_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","verb":"killswitch.set","actor":"a","scope":"global","reason":"r","issued_at":"2026-03-01T12:00:00.000Z"}`))
	f.Add([]byte(`{"manifests":[{"a":1}],"signature":null}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		cmd, err := DecodeControlCommand(raw, 1<<16)
		if err != nil {
			return
		}
		// Whatever decodes must validate without panicking.
		_, _ = cmd.Validate(validateNow, time.Minute)
	})
}

func TestControlCommandManifestsAreObjectsForEveryVerb(t *testing.T) {
	c := baseCommand(VerbStatus)
	c.Manifests = []json.RawMessage{json.RawMessage(`"x"`)}
	if code, err := c.Validate(validateNow, time.Minute); code != CtlInvalid || !strings.Contains(err.Error(), "manifests[0]") {
		t.Fatalf("status with a non-object manifest: %q %v", code, err)
	}
}

// TestParseScopeEgress: the egress scopes split into kind egress and the
// rest as value; the other kinds are unchanged.
func TestParseScopeEgress(t *testing.T) {
	cases := []struct {
		in          string
		kind, value string
		ok          bool
	}{
		{"egress:global", ScopeEgress, "global", true},
		{"egress:agent:bot-7", ScopeEgress, "agent:bot-7", true},
		{"egress:session:s:1", ScopeEgress, "session:s:1", true},
		{"egress:session:" + strings.Repeat("s", 257), "", "", false},
		{"egress:tool:files/read_file", "", "", false},
		{"egress:", "", "", false},
		{"egress", "", "", false},
		{"egress:agent", "", "", false},
		{"global", ScopeGlobal, "", true},
		{"session:s-1", ScopeSession, "s-1", true},
	}
	for _, tc := range cases {
		kind, value, ok := ParseScope(tc.in)
		if ok != tc.ok || (ok && (kind != tc.kind || value != tc.value)) {
			t.Errorf("ParseScope(%q) = %q, %q, %v; want %q, %q, %v", tc.in, kind, value, ok, tc.kind, tc.value, tc.ok)
		}
	}
}

// TestApprovalVerbsMutate: approve and reject are control verbs that
// change state (appended to TALOS_CONTROL, applied by every worker).
func TestApprovalVerbsMutate(t *testing.T) {
	for _, v := range []string{VerbApprove, VerbReject} {
		if !slices.Contains(Verbs, v) || !MutatingVerbs[v] {
			t.Errorf("%s: in Verbs %v, mutating %v", v, slices.Contains(Verbs, v), MutatingVerbs[v])
		}
		if got := ControlSubject(v); got != "talos.control."+v {
			t.Errorf("ControlSubject(%s) = %s", v, got)
		}
	}
}
