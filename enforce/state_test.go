package enforce

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 890_000_000, time.UTC)

const t0s = "2026-03-04T05:06:07.890Z"

// ctl builds an accepted control record for verb, signed off by "alice".
func ctl(verb string, set func(*schemas.ControlCommand)) *schemas.ControlRecord {
	cmd := &schemas.ControlCommand{SchemaVersion: schemas.ControlCommandVersion,
		CommandID: "0190f5b2-7c1e-7a3b-8d4e-00000000c0de", Verb: verb, Actor: "alice",
		Reason: "why " + verb, IssuedAt: t0s}
	if set != nil {
		set(cmd)
	}
	return &schemas.ControlRecord{CommandID: cmd.CommandID, Verb: verb, Actor: cmd.Actor, Reason: cmd.Reason,
		Accepted: true, Command: cmd}
}

func scope(s string) func(*schemas.ControlCommand) {
	return func(c *schemas.ControlCommand) { c.Scope = s }
}
func session(s string) func(*schemas.ControlCommand) {
	return func(c *schemas.ControlCommand) { c.SessionID = s }
}
func target(s string) func(*schemas.ControlCommand) {
	return func(c *schemas.ControlCommand) { c.Target = s }
}
func digest(s string) func(*schemas.ControlCommand) {
	return func(c *schemas.ControlCommand) { c.Digest = s }
}
func manifests(ms ...[]byte) func(*schemas.ControlCommand) {
	return func(c *schemas.ControlCommand) {
		for _, m := range ms {
			c.Manifests = append(c.Manifests, m)
		}
	}
}

func rawManifests(ms []json.RawMessage) func(*schemas.ControlCommand) {
	return func(c *schemas.ControlCommand) { c.Manifests = append(c.Manifests, ms...) }
}

// manifestFiles reads testdata/registry by file name.
func manifestFiles(t testing.TB) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, n := range []string{"assistant.json", "files.json", "github.json"} {
		b, err := os.ReadFile(filepath.Join("testdata/registry", n))
		if err != nil {
			t.Fatal(err)
		}
		out[n] = b
	}
	return out
}

func freshState(t testing.TB) *State {
	t.Helper()
	s, err := NewState(StateConfig{Bootstrap: testRegistry(t), NewEffectID: func() string { return fixedID }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// entry is the StateEntry ctl(verb) leaves when applied at seq.
func entry(target, verb string, seq uint64) schemas.StateEntry {
	return schemas.StateEntry{Target: target, Reason: "why " + verb, Actor: "alice", Seq: seq, Time: t0s}
}

func emptyView(seq uint64) schemas.IncidentView {
	return schemas.IncidentView{Seq: seq, KillSwitches: []schemas.StateEntry{}, Quarantines: []schemas.StateEntry{},
		Revocations: []schemas.StateEntry{}, Registry: schemas.RegistryView{Published: []schemas.PublishedBundle{}}}
}

func TestStateApplyVerbs(t *testing.T) {
	ms := readManifests(t)
	filesDigest, err := BundleDigest([]json.RawMessage{ms["files.json"]})
	if err != nil {
		t.Fatal(err)
	}
	twoDigest, err := BundleDigest([]json.RawMessage{ms["github.json"], ms["assistant.json"]})
	if err != nil {
		t.Fatal(err)
	}
	filesBundle := schemas.PublishedBundle{Digest: filesDigest, Servers: []string{"files"}, Tools: 4, Seq: 1, Time: t0s, Actor: "alice"}
	badManifest := []byte(`{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"x","tools":[{"tool_name":"t","tool_class":"delete"}]}`)

	type step struct {
		rec  *schemas.ControlRecord
		code string // "" = applies
	}
	cases := []struct {
		name  string
		steps []step
		want  func(v *schemas.IncidentView) // edits emptyView(len(steps)) into the expected view
	}{
		{"kill switch set", []step{{ctl(schemas.VerbKillSwitchSet, scope("global")), ""}},
			func(v *schemas.IncidentView) {
				v.KillSwitches = []schemas.StateEntry{entry("global", schemas.VerbKillSwitchSet, 1)}
			}},
		{"kill switch set twice keeps the latest", []step{
			{ctl(schemas.VerbKillSwitchSet, scope("server:files")), ""},
			{ctl(schemas.VerbKillSwitchSet, func(c *schemas.ControlCommand) { c.Scope, c.Reason, c.Actor = "server:files", "again", "bob" }), ""}},
			func(v *schemas.IncidentView) {
				v.KillSwitches = []schemas.StateEntry{{Target: "server:files", Reason: "again", Actor: "bob", Seq: 2, Time: t0s}}
			}},
		{"kill switches sorted by scope", []step{
			{ctl(schemas.VerbKillSwitchSet, scope("tool:files/read_file")), ""},
			{ctl(schemas.VerbKillSwitchSet, scope("agent:a1")), ""},
			{ctl(schemas.VerbKillSwitchSet, scope("session:s1")), ""}},
			func(v *schemas.IncidentView) {
				v.KillSwitches = []schemas.StateEntry{entry("agent:a1", schemas.VerbKillSwitchSet, 2),
					entry("session:s1", schemas.VerbKillSwitchSet, 3), entry("tool:files/read_file", schemas.VerbKillSwitchSet, 1)}
			}},
		{"kill switch set then clear", []step{
			{ctl(schemas.VerbKillSwitchSet, scope("global")), ""},
			{ctl(schemas.VerbKillSwitchClear, scope("global")), ""}}, nil},
		{"kill switch clear of another scope leaves it", []step{
			{ctl(schemas.VerbKillSwitchSet, scope("server:files")), ""},
			{ctl(schemas.VerbKillSwitchClear, scope("tool:files/read_file")), ""}},
			func(v *schemas.IncidentView) {
				v.KillSwitches = []schemas.StateEntry{entry("server:files", schemas.VerbKillSwitchSet, 1)}
			}},
		{"kill switch clear when not set", []step{{ctl(schemas.VerbKillSwitchClear, scope("global")), ""}}, nil},
		{"kill switch bad server id", []step{{ctl(schemas.VerbKillSwitchSet, scope("server:Files!")), schemas.CtlInvalid}}, nil},
		{"kill switch tool without slash", []step{{ctl(schemas.VerbKillSwitchSet, scope("tool:files")), schemas.CtlInvalid}}, nil},
		{"kill switch unknown kind", []step{{ctl(schemas.VerbKillSwitchSet, scope("planet:mars")), schemas.CtlInvalid}}, nil},
		{"kill switch empty scope", []step{{ctl(schemas.VerbKillSwitchSet, nil), schemas.CtlInvalid}}, nil},
		{"kill switch clear bad scope", []step{{ctl(schemas.VerbKillSwitchClear, scope("agent:")), schemas.CtlInvalid}}, nil},
		{"quarantine set", []step{{ctl(schemas.VerbQuarantineSet, session("s1")), ""}},
			func(v *schemas.IncidentView) {
				v.Quarantines = []schemas.StateEntry{entry("s1", schemas.VerbQuarantineSet, 1)}
			}},
		{"quarantine set then clear", []step{
			{ctl(schemas.VerbQuarantineSet, session("s1")), ""},
			{ctl(schemas.VerbQuarantineClear, session("s1")), ""}}, nil},
		{"quarantine clear when not set", []step{{ctl(schemas.VerbQuarantineClear, session("s9")), ""}}, nil},
		{"quarantine without session", []step{{ctl(schemas.VerbQuarantineSet, nil), schemas.CtlInvalid}}, nil},
		{"revoke capability and agent", []step{
			{ctl(schemas.VerbRevoke, target("cap-1")), ""},
			{ctl(schemas.VerbRevoke, target("agent:a1")), ""}},
			func(v *schemas.IncidentView) {
				v.Revocations = []schemas.StateEntry{entry("agent:a1", schemas.VerbRevoke, 2), entry("cap-1", schemas.VerbRevoke, 1)}
			}},
		{"revoke without target", []step{{ctl(schemas.VerbRevoke, nil), schemas.CtlInvalid}}, nil},
		{"publish does not pin", []step{{ctl(schemas.VerbRegistryPublish, manifests(ms["files.json"])), ""}},
			func(v *schemas.IncidentView) { v.Registry.Published = []schemas.PublishedBundle{filesBundle} }},
		{"publish two bundles, listed by seq", []step{
			{ctl(schemas.VerbRegistryPublish, manifests(ms["files.json"])), ""},
			{ctl(schemas.VerbRegistryPublish, manifests(ms["github.json"], ms["assistant.json"])), ""}},
			func(v *schemas.IncidentView) {
				v.Registry.Published = []schemas.PublishedBundle{filesBundle,
					{Digest: twoDigest, Servers: []string{"assistant", "github"}, Tools: 5, Seq: 2, Time: t0s, Actor: "alice"}}
			}},
		{"publish invalid manifest", []step{{ctl(schemas.VerbRegistryPublish, manifests(badManifest)), schemas.CtlInvalid}}, nil},
		{"publish duplicate server", []step{{ctl(schemas.VerbRegistryPublish, manifests(ms["files.json"], ms["files.json"])), schemas.CtlInvalid}}, nil},
		{"publish nothing", []step{{ctl(schemas.VerbRegistryPublish, nil), schemas.CtlInvalid}}, nil},
		{"publish then pin", []step{
			{ctl(schemas.VerbRegistryPublish, manifests(ms["files.json"])), ""},
			{ctl(schemas.VerbRegistryPin, digest(filesDigest)), ""}},
			func(v *schemas.IncidentView) {
				v.Registry = schemas.RegistryView{Pinned: filesDigest, PinnedSeq: 2, Published: []schemas.PublishedBundle{filesBundle}}
			}},
		{"pin unknown digest", []step{{ctl(schemas.VerbRegistryPin, digest(filesDigest)), schemas.CtlNotFound}}, nil},
		{"pin without digest", []step{{ctl(schemas.VerbRegistryPin, nil), schemas.CtlInvalid}}, nil},
		{"replay flush", []step{{ctl(schemas.VerbReplayFlush, session("s1")), ""}, {ctl(schemas.VerbReplayFlush, nil), ""}}, nil},
		{"unknown verb", []step{{ctl("killswitch.explode", scope("global")), schemas.CtlUnknownVerb}}, nil},
		{"read verb in the stream", []step{{ctl(schemas.VerbKillSwitchList, nil), schemas.CtlInvalid}}, nil},
		{"record not accepted", []step{{func() *schemas.ControlRecord {
			r := ctl(schemas.VerbKillSwitchSet, scope("global"))
			r.Accepted, r.Code = false, schemas.CtlStale
			return r
		}(), schemas.CtlInvalid}}, nil},
		{"record verb differs from command", []step{{func() *schemas.ControlRecord {
			r := ctl(schemas.VerbKillSwitchSet, scope("global"))
			r.Verb = schemas.VerbKillSwitchClear
			return r
		}(), schemas.CtlVerbMismatch}}, nil},
		{"record without command", []step{{&schemas.ControlRecord{Verb: schemas.VerbKillSwitchSet, Accepted: true}, schemas.CtlMalformed}}, nil},
		{"nil record", []step{{nil, schemas.CtlMalformed}}, nil},
		{"invalid command between valid ones changes nothing", []step{
			{ctl(schemas.VerbQuarantineSet, session("s1")), ""},
			{ctl(schemas.VerbQuarantineClear, nil), schemas.CtlInvalid},
			{ctl(schemas.VerbKillSwitchSet, scope("global")), ""}},
			func(v *schemas.IncidentView) {
				v.Quarantines = []schemas.StateEntry{entry("s1", schemas.VerbQuarantineSet, 1)}
				v.KillSwitches = []schemas.StateEntry{entry("global", schemas.VerbKillSwitchSet, 3)}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := freshState(t)
			for i, st := range tc.steps {
				seq := uint64(i + 1)
				next, err := s.Apply(seq, st.rec, t0)
				if next == nil {
					t.Fatalf("step %d: nil State", seq)
				}
				if next.Seq() != seq {
					t.Errorf("step %d: Seq %d, want %d", seq, next.Seq(), seq)
				}
				var ce *CommandError
				switch {
				case st.code == "" && err != nil:
					t.Errorf("step %d: unexpected error %v", seq, err)
				case st.code != "" && !errors.As(err, &ce):
					t.Errorf("step %d: error %v, want a *CommandError %s", seq, err, st.code)
				case st.code != "" && (ce.Code != st.code || ce.Seq != seq || ce.Detail == ""):
					t.Errorf("step %d: %+v, want code %s", seq, ce, st.code)
				}
				if err != nil {
					// Only the seq advanced.
					before, after := s.View(), next.View()
					before.Seq = seq
					if !reflect.DeepEqual(before, after) || next.Registry() != s.Registry() {
						t.Errorf("step %d: invalid command changed the state:\n%+v\n%+v", seq, before, after)
					}
				}
				s = next
			}
			want := emptyView(uint64(len(tc.steps)))
			if tc.want != nil {
				tc.want(&want)
			}
			if got := s.View(); !reflect.DeepEqual(got, want) {
				gj, _ := json.Marshal(got)
				wj, _ := json.Marshal(want)
				t.Errorf("view\n got %s\nwant %s", gj, wj)
			}
		})
	}
}

func TestStateApplyStaleSeq(t *testing.T) {
	s, err := freshState(t).Apply(5, ctl(schemas.VerbKillSwitchSet, scope("global")), t0)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{0, 4, 5} {
		got, err := s.Apply(seq, ctl(schemas.VerbKillSwitchClear, scope("global")), t0)
		if !errors.Is(err, ErrStaleSeq) || got != s {
			t.Errorf("seq %d: %v, same state %v", seq, err, got == s)
		}
	}
	if codes, _ := s.Check(&schemas.ToolCall{ServerID: "files", ToolName: "x", SessionID: "s"}); len(codes) != 1 {
		t.Errorf("stale clear applied: %v", codes)
	}
}

func TestStateRevoked(t *testing.T) {
	s := freshState(t)
	s, _ = s.Apply(1, ctl(schemas.VerbRevoke, target("cap-1")), t0)
	s, _ = s.Apply(2, ctl(schemas.VerbRevoke, target("agent:a1")), t0)
	for target, want := range map[string]bool{"cap-1": true, "agent:a1": true, "cap-2": false, "a1": false, "agent:a2": false, "": false} {
		if got := s.Revoked(target); got != want {
			t.Errorf("Revoked(%q) = %v, want %v", target, got, want)
		}
	}
}

// call is a valid-envelope ToolCall for Check.
func call(server, tool, agent, sess string) *schemas.ToolCall {
	return &schemas.ToolCall{Phase: schemas.PhasePre, ServerID: server, ToolName: tool, SessionID: sess,
		Actor:   schemas.Actor{Kind: "agent", AgentID: agent},
		Request: schemas.Request{Name: tool, Arguments: json.RawMessage(`{"path":"secret-argument-value"}`)}}
}

func TestStateCheckScopes(t *testing.T) {
	kill := func(s string) *schemas.ControlRecord { return ctl(schemas.VerbKillSwitchSet, scope(s)) }
	unkill := func(s string) *schemas.ControlRecord { return ctl(schemas.VerbKillSwitchClear, scope(s)) }
	quar := ctl(schemas.VerbQuarantineSet, session("s1"))
	ks, sq := schemas.CodeKillSwitch, schemas.CodeSessionQuarantined
	cases := []struct {
		name    string
		recs    []*schemas.ControlRecord
		call    *schemas.ToolCall
		codes   []string
		details int
	}{
		{"nothing set", nil, call("files", "read_file", "a1", "s1"), nil, 0},
		{"tool scope stops its tool", []*schemas.ControlRecord{kill("tool:files/read_file")}, call("files", "read_file", "a1", "s1"), []string{ks}, 1},
		{"tool scope spares a sibling", []*schemas.ControlRecord{kill("tool:files/read_file")}, call("files", "write_file", "a1", "s1"), nil, 0},
		{"tool scope spares same tool name elsewhere", []*schemas.ControlRecord{kill("tool:files/read_file")}, call("github", "read_file", "a1", "s1"), nil, 0},
		{"server scope stops read_file", []*schemas.ControlRecord{kill("server:files")}, call("files", "read_file", "a1", "s1"), []string{ks}, 1},
		{"server scope stops write_file", []*schemas.ControlRecord{kill("server:files")}, call("files", "write_file", "a1", "s1"), []string{ks}, 1},
		{"server scope spares other servers", []*schemas.ControlRecord{kill("server:files")}, call("github", "list-prs", "a1", "s1"), nil, 0},
		{"server scope is not a prefix match", []*schemas.ControlRecord{kill("server:file")}, call("files", "read_file", "a1", "s1"), nil, 0},
		{"agent scope stops that agent", []*schemas.ControlRecord{kill("agent:a1")}, call("github", "list-prs", "a1", "s2"), []string{ks}, 1},
		{"agent scope spares another agent", []*schemas.ControlRecord{kill("agent:a1")}, call("github", "list-prs", "a2", "s1"), nil, 0},
		{"agent scope spares a call without agent", []*schemas.ControlRecord{kill("agent:a1")}, call("github", "list-prs", "", "s1"), nil, 0},
		{"session scope", []*schemas.ControlRecord{kill("session:s1")}, call("files", "read_file", "a1", "s1"), []string{ks}, 1},
		{"session scope spares other sessions", []*schemas.ControlRecord{kill("session:s1")}, call("files", "read_file", "a1", "s2"), nil, 0},
		{"global stops everything", []*schemas.ControlRecord{kill("global")}, call("nope", "x", "", "s9"), []string{ks}, 1},
		{"several scopes: one code, a detail each", []*schemas.ControlRecord{kill("global"), kill("server:files"), kill("tool:files/read_file"), kill("agent:a1"), kill("session:s1")},
			call("files", "read_file", "a1", "s1"), []string{ks}, 5},
		{"clear restores", []*schemas.ControlRecord{kill("server:files"), unkill("server:files")}, call("files", "read_file", "a1", "s1"), nil, 0},
		{"clear of one scope keeps another", []*schemas.ControlRecord{kill("server:files"), kill("global"), unkill("global")}, call("files", "read_file", "a1", "s1"), []string{ks}, 1},
		{"quarantined session", []*schemas.ControlRecord{quar}, call("files", "read_file", "a1", "s1"), []string{sq}, 1},
		{"quarantine spares other sessions", []*schemas.ControlRecord{quar}, call("files", "read_file", "a1", "s2"), nil, 0},
		{"quarantine cleared", []*schemas.ControlRecord{quar, ctl(schemas.VerbQuarantineClear, session("s1"))}, call("files", "read_file", "a1", "s1"), nil, 0},
		{"kill switch and quarantine", []*schemas.ControlRecord{quar, kill("session:s1")}, call("files", "read_file", "a1", "s1"), []string{ks, sq}, 2},
		{"revocation is not a kill switch", []*schemas.ControlRecord{ctl(schemas.VerbRevoke, target("agent:a1"))}, call("files", "read_file", "a1", "s1"), nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := freshState(t)
			for i, r := range tc.recs {
				var err error
				if s, err = s.Apply(uint64(i+1), r, t0); err != nil {
					t.Fatal(err)
				}
			}
			codes, details := s.Check(tc.call)
			if !slices.Equal(codes, tc.codes) || len(details) != tc.details {
				t.Fatalf("codes %v details %q, want %v and %d details", codes, details, tc.codes, tc.details)
			}
			for _, d := range details {
				if strings.Contains(d, "secret-argument-value") || !strings.Contains(d, "why ") {
					t.Errorf("detail %q: must give the reason and no argument value", d)
				}
			}
		})
	}
}

func TestStateCheckDetailNamesScope(t *testing.T) {
	s, _ := freshState(t).Apply(3, ctl(schemas.VerbKillSwitchSet, func(c *schemas.ControlCommand) {
		c.Scope, c.Reason = "tool:files/read_file", "exfiltration suspected"
	}), t0)
	_, details := s.Check(call("files", "read_file", "a1", "s1"))
	if len(details) != 1 || !strings.Contains(details[0], "tool:files/read_file") ||
		!strings.Contains(details[0], "exfiltration suspected") || !strings.Contains(details[0], "3") {
		t.Fatalf("details %q", details)
	}
}

// TestStateCopyOnWrite: Apply never changes the State it is called on.
func TestStateCopyOnWrite(t *testing.T) {
	ms := readManifests(t)
	d, _ := BundleDigest([]json.RawMessage{ms["files.json"]})
	s0 := freshState(t)
	v0 := s0.View()
	s1, err := s0.Apply(1, ctl(schemas.VerbKillSwitchSet, scope("server:files")), t0)
	if err != nil {
		t.Fatal(err)
	}
	v1 := s1.View()
	if s1.Engine() != s0.Engine() {
		t.Error("a kill switch rebuilt the Engine")
	}
	s := s1
	for i, r := range []*schemas.ControlRecord{
		ctl(schemas.VerbKillSwitchClear, scope("server:files")),
		ctl(schemas.VerbKillSwitchSet, scope("global")),
		ctl(schemas.VerbQuarantineSet, session("s1")),
		ctl(schemas.VerbRevoke, target("cap-1")),
		ctl(schemas.VerbRegistryPublish, manifests(ms["files.json"])),
		ctl(schemas.VerbRegistryPin, digest(d)),
	} {
		if s, err = s.Apply(uint64(i+2), r, t0.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	// Enough writes to touch every shard of the maps s1 shares.
	many := s1
	for i := range 100 {
		many, _ = many.Apply(uint64(100+2*i), ctl(schemas.VerbKillSwitchSet, scope(fmt.Sprintf("agent:x%d", i))), t0)
		many, _ = many.Apply(uint64(101+2*i), ctl(schemas.VerbQuarantineSet, session(fmt.Sprintf("x%d", i))), t0)
	}
	if len(many.View().KillSwitches) != 101 {
		t.Fatalf("%d kill switches", len(many.View().KillSwitches))
	}
	if !reflect.DeepEqual(s0.View(), v0) || !reflect.DeepEqual(s1.View(), v1) {
		t.Fatalf("earlier States changed:\n%+v\n%+v", s0.View(), s1.View())
	}
	if s0.Seq() != 0 || s1.Seq() != 1 || s.Seq() != 7 {
		t.Errorf("seqs %d %d %d", s0.Seq(), s1.Seq(), s.Seq())
	}
	if c, _ := s0.Check(call("files", "read_file", "a1", "s1")); c != nil {
		t.Errorf("s0 checks %v", c)
	}
	if c, _ := s1.Check(call("github", "list-prs", "a1", "s2")); c != nil {
		t.Errorf("s1 sees a later global kill switch: %v", c)
	}
	if c, _ := s.Check(call("github", "list-prs", "a1", "s1")); !slices.Equal(c, []string{schemas.CodeKillSwitch, schemas.CodeSessionQuarantined}) {
		t.Errorf("s checks %v", c)
	}
	if s0.Registry().Digest() != testRegistry(t).Digest() || s1.Registry() != s0.Registry() || s.Registry().Digest() != d {
		t.Errorf("registries: %s %s %s", s0.Registry().Digest(), s1.Registry().Digest(), s.Registry().Digest())
	}
	if s0.Revoked("cap-1") || !s.Revoked("cap-1") {
		t.Error("revocation leaked into s0 or missing from s")
	}
}

// TestStateRegistryPin: publish + pin switches the effective registry; a
// call made under the old digest is then REGISTRY_VERSION_MISMATCH.
func TestStateRegistryPin(t *testing.T) {
	ms := readManifests(t)
	boot := testRegistry(t)
	d, err := BundleDigest([]json.RawMessage{ms["files.json"]})
	if err != nil {
		t.Fatal(err)
	}
	if d == boot.Digest() {
		t.Fatal("test needs two different registries")
	}
	s := freshState(t)
	if code, _ := s.Precheck(ctl(schemas.VerbRegistryPin, digest(d)).Command); code != schemas.CtlNotFound {
		t.Errorf("precheck of an unpublished pin: %q", code)
	}
	unpinned, err := s.Apply(1, ctl(schemas.VerbRegistryPin, digest(d)), t0)
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Code != schemas.CtlNotFound || unpinned.Registry().Digest() != boot.Digest() {
		t.Fatalf("pin of an unpublished digest: %v, registry %s", err, unpinned.Registry().Digest())
	}
	published, err := unpinned.Apply(2, ctl(schemas.VerbRegistryPublish, manifests(ms["files.json"])), t0)
	if err != nil {
		t.Fatal(err)
	}
	if published.Registry().Digest() != boot.Digest() || published.Engine() != s.Engine() {
		t.Error("publish changed the effective registry")
	}
	if code, detail := published.Precheck(ctl(schemas.VerbRegistryPin, digest(d)).Command); code != "" {
		t.Errorf("precheck of a published pin: %s %s", code, detail)
	}
	pinned, err := published.Apply(3, ctl(schemas.VerbRegistryPin, digest(d)), t0)
	if err != nil {
		t.Fatal(err)
	}
	if pinned.Registry().Digest() != d || pinned.Engine().Registry().Digest() != d || pinned.Mode() != ModeProd {
		t.Fatalf("pinned registry %s mode %s", pinned.Registry().Digest(), pinned.Mode())
	}
	if v := pinned.View(); v.Registry.Pinned != d || v.Registry.PinnedSeq != 3 {
		t.Errorf("view registry %+v", v.Registry)
	}

	dec, err := NewDecider(testEngine(t, ModeProd), DeciderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dec.SetState(pinned)
	decide := func(env map[string]any) schemas.Receipt {
		t.Helper()
		raw, _ := json.Marshal(env)
		r, _, err := dec.Decide("talos.call.pre.gw-1."+env["server_id"].(string), raw, t0)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	old := decide(with(envelope("pre", "files", "list_dir", map[string]any{"path": "/"}), "registry_digest", boot.Digest()))
	if old.Decision != schemas.DecisionDeny || !slices.Equal(old.ReasonCodes, []string{schemas.CodeRegistryVersionMismatch}) ||
		old.RegistryDigest != d || old.ControlSeq != 3 {
		t.Errorf("old digest: %s %v registry %s seq %d", old.Decision, old.ReasonCodes, old.RegistryDigest, old.ControlSeq)
	}
	cur := decide(with(envelope("pre", "files", "list_dir", map[string]any{"path": "/"}), "registry_digest", d))
	if cur.Decision != schemas.DecisionAllow {
		t.Errorf("pinned digest: %s %v", cur.Decision, cur.ReasonCodes)
	}
	// github is in the bootstrap registry but not in the pinned bundle.
	gone := decide(envelope("pre", "github", "list-prs", map[string]any{}))
	if !slices.Equal(gone.ReasonCodes, []string{schemas.CodeToolUnclassifiedDenied, schemas.CodeUnknownTool}) {
		t.Errorf("tool outside the pinned bundle: %v", gone.ReasonCodes)
	}
}

func TestStatePrecheck(t *testing.T) {
	ms := readManifests(t)
	s := freshState(t)
	cases := []struct {
		name string
		rec  *schemas.ControlRecord
		code string
	}{
		{"kill switch ok", ctl(schemas.VerbKillSwitchSet, scope("tool:files/read_file")), ""},
		{"kill switch bad scope", ctl(schemas.VerbKillSwitchSet, scope("tool:/x")), schemas.CtlInvalid},
		{"kill switch clear bad scope", ctl(schemas.VerbKillSwitchClear, scope("globally")), schemas.CtlInvalid},
		{"clear what is not set", ctl(schemas.VerbKillSwitchClear, scope("global")), ""},
		{"quarantine ok", ctl(schemas.VerbQuarantineSet, session("s1")), ""},
		{"quarantine no session", ctl(schemas.VerbQuarantineClear, nil), schemas.CtlInvalid},
		{"revoke ok", ctl(schemas.VerbRevoke, target("cap-1")), ""},
		{"revoke no target", ctl(schemas.VerbRevoke, nil), schemas.CtlInvalid},
		{"publish ok", ctl(schemas.VerbRegistryPublish, manifests(ms["files.json"], ms["github.json"])), ""},
		{"publish invalid", ctl(schemas.VerbRegistryPublish, manifests([]byte(`{"schema_id":"nope"}`))), schemas.CtlInvalid},
		{"publish not JSON", ctl(schemas.VerbRegistryPublish, manifests([]byte(`{`))), schemas.CtlInvalid},
		{"publish duplicate server", ctl(schemas.VerbRegistryPublish, manifests(ms["github.json"], reformat(t, ms["github.json"]))), schemas.CtlInvalid},
		{"publish none", ctl(schemas.VerbRegistryPublish, nil), schemas.CtlInvalid},
		{"pin unpublished", ctl(schemas.VerbRegistryPin, digest("sha256:"+strings.Repeat("a", 64))), schemas.CtlNotFound},
		{"pin no digest", ctl(schemas.VerbRegistryPin, nil), schemas.CtlInvalid},
		{"flush", ctl(schemas.VerbReplayFlush, nil), ""},
		{"read verb", ctl(schemas.VerbKillSwitchList, nil), ""},
		{"unknown verb", ctl("registry.burn", nil), schemas.CtlUnknownVerb},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, detail := s.Precheck(tc.rec.Command)
			if code != tc.code || (code != "") != (detail != "") {
				t.Errorf("Precheck = %q %q, want %q", code, detail, tc.code)
			}
			// Precheck and Apply agree on mutating verbs.
			if !schemas.MutatingVerbs[tc.rec.Command.Verb] {
				return
			}
			_, err := s.Apply(1, tc.rec, t0)
			var ce *CommandError
			if (err == nil) != (tc.code == "") || (err != nil && (!errors.As(err, &ce) || ce.Code != tc.code)) {
				t.Errorf("Apply: %v, Precheck said %q", err, tc.code)
			}
		})
	}
	if code, _ := s.Precheck(nil); code != schemas.CtlMalformed {
		t.Errorf("nil command: %q", code)
	}
}

func TestBundleDigestMatchesRegistry(t *testing.T) {
	ms := readManifests(t)
	reg, err := NewRegistry(ms["github.json"], ms["files.json"])
	if err != nil {
		t.Fatal(err)
	}
	d, err := BundleDigest([]json.RawMessage{reformat(t, ms["files.json"]), ms["github.json"]})
	if err != nil || d != reg.Digest() {
		t.Fatalf("BundleDigest %s %v, Registry.Digest %s", d, err, reg.Digest())
	}
	if _, err := BundleDigest([]json.RawMessage{[]byte(`[]`)}); err == nil {
		t.Error("BundleDigest accepted a non-manifest")
	}
}

// controlEvents is a deterministic mix of n control events over a small
// space of targets, invalid ones included, with the expected final state
// computed by a plain model.
func controlEvents(t testing.TB, n int) ([]*schemas.ControlRecord, schemas.IncidentView) {
	ms := manifestFiles(t)
	bundles := [][]json.RawMessage{{ms["files.json"]}, {ms["github.json"]}, {ms["files.json"], ms["assistant.json"]}}
	digests := make([]string, len(bundles))
	for i, b := range bundles {
		digests[i], _ = BundleDigest(b)
	}
	scopes := []string{"global", "server:files", "server:github", "tool:files/read_file", "tool:github/list-prs"}
	for i := range 40 {
		scopes = append(scopes, fmt.Sprintf("agent:a%d", i), fmt.Sprintf("session:s%d", i))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	kills, quars, revs := map[string]schemas.StateEntry{}, map[string]schemas.StateEntry{}, map[string]schemas.StateEntry{}
	published := map[string]schemas.PublishedBundle{}
	var reg schemas.RegistryView
	recs := make([]*schemas.ControlRecord, 0, n)
	for i := range n {
		seq := uint64(i + 1)
		at := t0.Add(time.Duration(i) * time.Second).Format(schemas.TimeFormat)
		actor := fmt.Sprintf("responder-%d", rng.IntN(3))
		reason := fmt.Sprintf("reason %d", i)
		set := func(m map[string]schemas.StateEntry, k string) {
			m[k] = schemas.StateEntry{Target: k, Reason: reason, Actor: actor, Seq: seq, Time: at}
		}
		var r *schemas.ControlRecord
		switch k := rng.IntN(10); {
		case k < 3:
			sc := scopes[rng.IntN(len(scopes))]
			r = ctl(schemas.VerbKillSwitchSet, scope(sc))
			set(kills, sc)
		case k < 5:
			sc := scopes[rng.IntN(len(scopes))]
			r = ctl(schemas.VerbKillSwitchClear, scope(sc))
			delete(kills, sc)
		case k == 5:
			sid := fmt.Sprintf("s%d", rng.IntN(30))
			if rng.IntN(2) == 0 {
				r = ctl(schemas.VerbQuarantineSet, session(sid))
				set(quars, sid)
			} else {
				r = ctl(schemas.VerbQuarantineClear, session(sid))
				delete(quars, sid)
			}
		case k == 6:
			tg := fmt.Sprintf("cap-%d", rng.IntN(500))
			r = ctl(schemas.VerbRevoke, target(tg))
			set(revs, tg)
		case k == 7:
			j := rng.IntN(len(bundles))
			if rng.IntN(2) == 0 {
				r = ctl(schemas.VerbRegistryPublish, rawManifests(bundles[j]))
				br, err := bundleRegistry(bundles[j])
				if err != nil {
					t.Fatal(err)
				}
				pb := schemas.PublishedBundle{Digest: digests[j], Seq: seq, Time: at, Actor: actor}
				for _, m := range br.Manifests() {
					pb.Servers = append(pb.Servers, m.ServerID)
					pb.Tools += len(m.Tools)
				}
				published[digests[j]] = pb
			} else {
				r = ctl(schemas.VerbRegistryPin, digest(digests[j]))
				if _, ok := published[digests[j]]; ok {
					reg.Pinned, reg.PinnedSeq = digests[j], seq
				}
			}
		case k == 8:
			r = ctl(schemas.VerbReplayFlush, session("s1"))
		default: // invalid: consumes its seq, changes nothing
			r = ctl(schemas.VerbKillSwitchSet, scope("server:NOT VALID"))
		}
		r.Command.Actor, r.Command.Reason = actor, reason
		recs = append(recs, r)
	}
	want := emptyView(uint64(n))
	sorted := func(m map[string]schemas.StateEntry) []schemas.StateEntry {
		out := []schemas.StateEntry{}
		for _, e := range m {
			out = append(out, e)
		}
		slices.SortFunc(out, func(a, b schemas.StateEntry) int { return strings.Compare(a.Target, b.Target) })
		return out
	}
	want.KillSwitches, want.Quarantines, want.Revocations = sorted(kills), sorted(quars), sorted(revs)
	reg.Published = []schemas.PublishedBundle{}
	for _, pb := range published {
		reg.Published = append(reg.Published, pb)
	}
	slices.SortFunc(reg.Published, func(a, b schemas.PublishedBundle) int { return int(a.Seq) - int(b.Seq) })
	want.Registry = reg
	return recs, want
}

// TestStateReplayDeterministic: a worker that applied 1,000 events as they
// arrived and one that replays them from the start hold the same State,
// and it is the one a plain model of the commands predicts.
func TestStateReplayDeterministic(t *testing.T) {
	const n = 1000
	recs, want := controlEvents(t, n)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }

	live, err := NewDecider(testEngine(t, ModeProd), DeciderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mid *State
	var midView schemas.IncidentView
	invalid := 0
	for i, r := range recs {
		if err := live.Apply(uint64(i+1), r, at(i)); err != nil {
			invalid++
		}
		if i == n/2 {
			mid, midView = live.State(), live.State().View()
		}
	}
	if invalid == 0 || invalid == n {
		t.Fatalf("%d invalid events: the mix should hold some", invalid)
	}

	replayed := freshState(t)
	for i, r := range recs {
		replayed, _ = replayed.Apply(uint64(i+1), r, at(i))
	}
	a, b := live.State().View(), replayed.View()
	aj, _ := json.Marshal(a)
	bj, _ := json.Marshal(b)
	if string(aj) != string(bj) {
		t.Fatalf("live and replayed views differ:\n%s\n%s", aj, bj)
	}
	if !reflect.DeepEqual(a, want) {
		wj, _ := json.Marshal(want)
		t.Fatalf("view differs from the model:\n got %s\nwant %s", aj, wj)
	}
	if live.State().Registry().Digest() != replayed.Registry().Digest() {
		t.Errorf("registries differ: %s %s", live.State().Registry().Digest(), replayed.Registry().Digest())
	}
	if !reflect.DeepEqual(mid.View(), midView) {
		t.Error("a State taken mid-way changed while later events applied")
	}
}

func BenchmarkStateApply1000(b *testing.B) {
	recs, _ := controlEvents(b, 1000)
	base := freshState(b)
	b.ReportAllocs()
	for b.Loop() {
		s := base
		for i, r := range recs {
			s, _ = s.Apply(uint64(i+1), r, t0)
		}
	}
}
