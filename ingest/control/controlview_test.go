package control

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// A propagation in milliseconds: the last worker's delay after the ack and
// after sending, each worker's after the ack (never negative), JSON keys
// as talosctl --json has always printed them.
func TestPropagationSummaryAndText(t *testing.T) {
	sent := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	p := &Propagation{Seq: 7, Sent: sent, Acked: sent.Add(2 * time.Millisecond),
		Applied: map[string]time.Time{"w1": sent.Add(1 * time.Millisecond), "w2": sent.Add(3500 * time.Microsecond)},
		Missing: []string{"w3"}}
	b, err := json.Marshal(p.Summary())
	if err != nil {
		t.Fatal(err)
	}
	want := `{"after_ack_ms":1.5,"after_send_ms":3.5,"applied_after_ack_ms":{"w1":0,"w2":1.5},"missing":["w3"],"seq":7,"workers":3}`
	if string(b) != want {
		t.Fatalf("summary %s, want %s", b, want)
	}
	var out bytes.Buffer
	if err := p.WriteText(&out); err != nil || out.String() != "enforced by 2/3 live workers 1.50 ms after the ack (3.50 ms after sending)\n" {
		t.Fatalf("text %q, %v", out.String(), err)
	}
	out.Reset()
	if err := (&Propagation{}).WriteText(&out); err != nil || !strings.HasPrefix(out.String(), "no live workers: nothing to wait for") {
		t.Fatalf("no workers: %q, %v", out.String(), err)
	}
}

func TestControlViewsText(t *testing.T) {
	var out bytes.Buffer
	check := func(name, want string, err error) {
		t.Helper()
		if err != nil || out.String() != want {
			t.Errorf("%s: %v\n%q\nwant\n%q", name, err, out.String(), want)
		}
		out.Reset()
	}
	check("no entries", "none (as of control seq 4)\n", WriteStateEntries(&out, "SCOPE", nil, 4))
	es := []schemas.StateEntry{{Target: "global", Reason: "incident", Actor: "ops@h", Seq: 3, Time: "T"}}
	check("entries", "SCOPE   REASON    ACTOR  SEQ  SINCE\nglobal  incident  ops@h  3    T\n", WriteStateEntries(&out, "SCOPE", es, 4))
	check("bootstrap registry", "pinned: the bootstrap registry of each worker (--registry); no registry.pin yet\npublished: none\n",
		WriteRegistryView(&out, schemas.RegistryView{}))
	r := schemas.RegistryView{Pinned: "sha256:ab", PinnedSeq: 9, Published: []schemas.PublishedBundle{
		{Digest: "sha256:ab", Servers: []string{"docs", "files"}, Tools: 5, Seq: 8, Time: "T", Actor: "ops"}}}
	check("registry", "pinned: sha256:ab (control seq 9)\nDIGEST     SERVERS     TOOLS  SEQ  TIME  ACTOR\nsha256:ab  docs,files  5      8    T     ops\n",
		WriteRegistryView(&out, r))
	check("no workers", "no live workers\n", WriteWorkerStatus(&out, nil))
	st := []schemas.WorkerStatus{{WorkerID: "w1", AppliedSeq: 9, ControlLast: 9, CaughtUp: true, RegistryDigest: "sha256:ab", Handled: 10, Time: "T"}}
	check("status", "WORKER  APPLIED  CONTROL_LAST  CAUGHT_UP  REGISTRY   HANDLED  REJECTED  LAST_SEEN\nw1      9        9             true       sha256:ab  10       0         T\n",
		WriteWorkerStatus(&out, st))
	state := &schemas.ControlReply{OK: true, State: &schemas.IncidentView{Seq: 4, Quarantines: es, Registry: r}}
	check("quarantine.list", "SESSION  REASON    ACTOR  SEQ  SINCE\nglobal   incident  ops@h  3    T\n", WriteReply(&out, schemas.VerbQuarantineList, state))
	check("killswitch.list", "none (as of control seq 4)\n", WriteReply(&out, schemas.VerbKillSwitchList, state))
	check("registry.show", "pinned: sha256:ab (control seq 9)\nDIGEST     SERVERS     TOOLS  SEQ  TIME  ACTOR\nsha256:ab  docs,files  5      8    T     ops\n",
		WriteReply(&out, schemas.VerbRegistryShow, state))
	check("status", "no live workers\n", WriteReply(&out, schemas.VerbStatus, &schemas.ControlReply{OK: true}))
	replay := &schemas.ControlReply{OK: true, Replay: &schemas.ReplayInfo{Keys: 3, Bytes: 120, Window: "24h0m0s"}}
	check("replay.stats", "correlation ids remembered: 3 (120 bytes), window 24h0m0s\n", WriteReply(&out, schemas.VerbReplayStats, replay))
	check("replay.check unseen", "not seen: a call with this correlation id would not be a replay\n", WriteReply(&out, schemas.VerbReplayCheck, replay))
	seen := true
	replay.Replay.Seen, replay.Replay.ToolCall = &seen, "tc-1"
	check("replay.check seen", "seen: used by tool call tc-1; another call with it is denied REPLAY\n", WriteReply(&out, schemas.VerbReplayCheck, replay))
	for verb, want := range map[string]string{schemas.VerbRegistryShow: "registry.show: reply without state",
		schemas.VerbReplayStats: "replay.stats: empty reply", schemas.VerbRevoke: "revoke: not a read verb"} {
		if err := WriteReply(&out, verb, &schemas.ControlReply{OK: true}); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", verb, err, want)
		}
	}
	if a := LocalActor(); a == "" || strings.HasSuffix(a, "@") {
		t.Errorf("LocalActor = %q", a)
	}
}
