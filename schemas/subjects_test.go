package schemas

import (
	"strings"
	"testing"
)

func TestParseCallSubject(t *testing.T) {
	for _, tc := range []struct {
		subject, phase, ep, server string
		ok                         bool
	}{
		{"talos.call.pre.gw-1.files", PhasePre, "gw-1", "files", true},
		{"talos.call.post.gw-1.files", PhasePost, "gw-1", "files", true},
		{"talos.call.pre.files", PhasePre, "", "", false},               // before subjects named the enforcement point
		{"talos.call.post.files", PhasePost, "", "", false},             // likewise: the phase is still read
		{"talos.call.pre.gw-1.files.x", PhasePre, "", "", false},        // a token too many
		{"talos.call.mid.gw-1.files", PhasePre, "gw-1", "files", false}, // no such phase
		{"talos.call.pre.GW.files", PhasePre, "", "files", false},       // not an ep_id
		{"talos.call.pre.gw-1.", PhasePre, "gw-1", "", false},
		{"talos.audit.pre.gw-1.files", PhasePre, "", "", false},
	} {
		phase, ep, server, ok := ParseCallSubject(tc.subject)
		if phase != tc.phase || ep != tc.ep || server != tc.server || ok != tc.ok {
			t.Errorf("%s: %q %q %q %v, want %q %q %q %v", tc.subject, phase, ep, server, ok, tc.phase, tc.ep, tc.server, tc.ok)
		}
	}
	if got := CallSubject(PhasePre, "gw-1", "files"); got != "talos.call.pre.gw-1.files" {
		t.Errorf("CallSubject = %q", got)
	}
	if got := CallMsgID("gw-1", "t", PhasePost, []byte("{}")); got != "gw-1:t:post:44136fa355b3678a" {
		t.Errorf("CallMsgID = %q", got)
	}
}

func TestParseApprovalTarget(t *testing.T) {
	const id = "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e"
	for _, tc := range []struct {
		target, ep, id string
		ok             bool
	}{
		{id, "", id, true},
		{"gw-1:" + id, "gw-1", id, true},
		{"GW:" + id, "", "", false},
		{":" + id, "", "", false},
		{"gw-1:" + id + ":pre", "", "", false},
		{"gw-1:call-1", "", "", false},
		{"{" + id + "}", "", "", false},
		{"", "", "", false},
	} {
		ep, got, ok := ParseApprovalTarget(tc.target)
		if ep != tc.ep || got != tc.id || ok != tc.ok {
			t.Errorf("%q: %q %q %v, want %q %q %v", tc.target, ep, got, ok, tc.ep, tc.id, tc.ok)
		}
	}
}

// FuzzParseCallSubject: a subject that parses is the subject its parts
// make, and names no part with a dot or wildcard in it.
func FuzzParseCallSubject(f *testing.F) {
	for _, s := range []string{"talos.call.pre.gw-1.files", "talos.call.post.a.b", "talos.call.pre.files", "talos.call..x.y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, subject string) {
		phase, ep, server, ok := ParseCallSubject(subject)
		if !ok {
			return
		}
		if CallSubject(phase, ep, server) != subject {
			t.Fatalf("%q parses to %q %q %q", subject, phase, ep, server)
		}
		if strings.ContainsAny(ep+server, ".*> ") || !ValidID(ep) || !ValidID(server) {
			t.Fatalf("%q: parts %q %q", subject, ep, server)
		}
	})
}

// ValidID is IDPattern written out: the two agree on every string.
func TestValidIDIsIDPattern(t *testing.T) {
	for _, s := range []string{"", "a", "0", "_", "-", "a_", "a-b_c9", "A", "aB", "a.b", "a b", "a\n", "a\x00", "é",
		strings.Repeat("a", 64), strings.Repeat("a", 65), "-a", "_a", "gw-1", "files"} {
		if got, want := ValidID(s), IDPattern.MatchString(s); got != want {
			t.Errorf("ValidID(%q) = %v, IDPattern says %v", s, got, want)
		}
	}
}

func FuzzValidID(f *testing.F) {
	for _, s := range []string{"gw-1", "", "A", strings.Repeat("z", 64), "a\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidID(s), IDPattern.MatchString(s); got != want {
			t.Fatalf("ValidID(%q) = %v, IDPattern says %v", s, got, want)
		}
	})
}

// BenchmarkValidID: IDPattern through the regexp engine against ValidID,
// on an ep_id as long as a gateway's.
func BenchmarkValidID(b *testing.B) {
	const id = "gw-payments-eu-1"
	b.Run("IDPattern", func(b *testing.B) {
		for b.Loop() {
			if !IDPattern.MatchString(id) {
				b.Fatal(id)
			}
		}
	})
	b.Run("ValidID", func(b *testing.B) {
		for b.Loop() {
			if !ValidID(id) {
				b.Fatal(id)
			}
		}
	})
}
