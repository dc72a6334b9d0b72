package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/testenv"
)

// TestControlCommandsCLI drives the control plane with the real binaries,
// as a responder would: a kill switch with --wait reports how long every
// live worker took to enforce it, the next call is denied, clearing
// restores; quarantine, registry publish/pin/show, replay stats and
// status answer; unsigned and untrusted commands are refused; bench
// measures propagation; and verify covers every control receipt.
func TestControlCommandsCLI(t *testing.T) {
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	for _, k := range []string{"worker", "responder", "stranger"} {
		if out, code := run(t, talosctl, "keys", "gen", "--out", filepath.Join(dir, k)); code != 0 {
			t.Fatalf("keys gen %s: %s", k, out)
		}
	}
	startTalosd(t, talosd, dir, "--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db,
		"--registry", "../talosd/demo/registry", "--signing-key", filepath.Join(dir, "worker.key"),
		"--responder-keys", filepath.Join(dir, "responder.pub"), "--http-addr", "", "--chains", "1", "--instance", "cli-worker", "--capabilities", "optional")

	g := []string{"--nats-url", ns.URL(), "--nats-auth", "none", "--clickhouse-addr", addr, "--clickhouse-database", db}
	ctl := func(args ...string) (string, int) {
		return run(t, talosctl, append(append(append([]string{}, g...), args[0]), append(args[1:], "--responder-key", filepath.Join(dir, "responder.key"), "--actor", "alice")...)...)
	}
	// The worker is up once status lists it as deciding.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, code := ctl("status")
		if code == 0 && strings.Contains(out, "cli-worker") && strings.Contains(out, "true") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live worker: exit %d\n%s", code, out)
		}
		time.Sleep(200 * time.Millisecond)
	}

	out, code := ctl("killswitch", "set", "tool:files/read_file", "--reason", "incident 7", "--wait")
	if code != 0 || !strings.Contains(out, "control seq 1") || !strings.Contains(out, "enforced by 1/1 live workers") || !strings.Contains(out, "ms after the ack") {
		t.Fatalf("killswitch set --wait: exit %d\n%s", code, out)
	}
	callRead := append(append([]string{}, g...), "call", "--server", "files", "--tool", "read_file", "--args", `{"path":"a"}`)
	if out, code := run(t, talosctl, callRead...); code != 0 || !strings.Contains(out, "DENY") || !strings.Contains(out, "KILL_SWITCH") {
		t.Fatalf("call under a kill switch: exit %d\n%s", code, out)
	}
	if out, code := ctl("killswitch", "list"); code != 0 || !strings.Contains(out, "tool:files/read_file") || !strings.Contains(out, "incident 7") || !strings.Contains(out, "alice") {
		t.Fatalf("killswitch list: exit %d\n%s", code, out)
	}
	if out, code := ctl("killswitch", "clear", "tool:files/read_file", "--reason", "resolved", "--wait"); code != 0 {
		t.Fatalf("killswitch clear: exit %d\n%s", code, out)
	}
	if out, code := run(t, talosctl, callRead...); code != 0 || !strings.Contains(out, "ALLOW") {
		t.Fatalf("call after clear: exit %d\n%s", code, out)
	}
	if out, code := ctl("killswitch", "set", "nonsense", "--reason", "x"); code != 2 {
		t.Fatalf("bad scope: exit %d, want 2\n%s", code, out)
	}
	if out, code := ctl("quarantine", "set", "s-1", "--reason", "injection", "--wait"); code != 0 || !strings.Contains(out, "enforced by 1/1") {
		t.Fatalf("quarantine set: exit %d\n%s", code, out)
	}
	if out, code := run(t, talosctl, append(callRead, "--session", "s-1")...); code != 0 || !strings.Contains(out, "SESSION_QUARANTINED") {
		t.Fatalf("call in a quarantined session: exit %d\n%s", code, out)
	}

	// Registry: publish the files manifest alone, pin it, and github is gone.
	if out, code := ctl("registry", "publish", "../talosd/demo/registry/files.json", "--reason", "trim"); code != 0 || !strings.Contains(out, "published sha256:") {
		t.Fatalf("registry publish: exit %d\n%s", code, out)
	}
	out, code = run(t, talosctl, append(g, "--json", "registry", "show", "--responder-key", filepath.Join(dir, "responder.key"))...)
	var show struct {
		State struct {
			Registry struct {
				Published []struct{ Digest string } `json:"published"`
			} `json:"registry"`
		} `json:"state"`
	}
	if err := json.Unmarshal([]byte(out), &show); err != nil || code != 0 || len(show.State.Registry.Published) != 1 {
		t.Fatalf("registry show --json: exit %d %v\n%s", code, err, out)
	}
	digest := show.State.Registry.Published[0].Digest
	if out, code := ctl("registry", "pin", digest, "--wait"); code != 0 {
		t.Fatalf("registry pin: exit %d\n%s", code, out)
	}
	if out, code := ctl("registry", "show"); code != 0 || !strings.Contains(out, "pinned: "+digest) {
		t.Fatalf("registry show: exit %d\n%s", code, out)
	}
	if out, code := run(t, talosctl, append(g, "call", "--server", "github", "--tool", "github", "--args", `{"action":"list_prs"}`)...); code != 0 || !strings.Contains(out, "UNKNOWN_TOOL") {
		t.Fatalf("call to a server the pinned registry dropped: exit %d\n%s", code, out)
	}
	if out, code := ctl("registry", "pin", "sha256:"+strings.Repeat("0", 64)); code != 1 || !strings.Contains(out, "CTL_NOT_FOUND") {
		t.Fatalf("pin of an unpublished digest: exit %d\n%s", code, out)
	}
	if out, code := ctl("replay", "stats"); code != 0 || !strings.Contains(out, "correlation ids remembered") {
		t.Fatalf("replay stats: exit %d\n%s", code, out)
	}

	// Refused: signed by a key talosd does not trust; and no key at all.
	if out, code := run(t, talosctl, append(g, "killswitch", "set", "global", "--reason", "x", "--responder-key", filepath.Join(dir, "stranger.key"))...); code != 1 || !strings.Contains(out, "CTL_UNTRUSTED_KEY") {
		t.Fatalf("untrusted key: exit %d\n%s", code, out)
	}
	if out, code := run(t, talosctl, append(g, "killswitch", "set", "global", "--reason", "x")...); code != 2 || !strings.Contains(out, "--responder-key") {
		t.Fatalf("no key: exit %d\n%s", code, out)
	}

	// bench: the propagation figure.
	out, code = run(t, talosctl, append(g, "--json", "bench", "--calls", "0", "--killswitch", "5", "--responder-key", filepath.Join(dir, "responder.key"))...)
	var br struct {
		KillSwitch ksResult `json:"killswitch"`
	}
	if err := json.Unmarshal([]byte(out), &br); err != nil || code != 0 || br.KillSwitch.Commands != 10 || br.KillSwitch.Workers != 1 || br.KillSwitch.AfterSendP99 <= 0 {
		t.Fatalf("bench --killswitch: exit %d %v\n%s", code, err, out)
	}

	// Every command above, accepted or refused, is a signed receipt in
	// ClickHouse, and verify covers them.
	ctx := context.Background()
	conn, err := query.Open(ctx, addr, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline = time.Now().Add(60 * time.Second)
	for {
		var accepted, refused uint64
		_ = conn.QueryRow(ctx, "SELECT countIf(accepted = 1 AND stream_seq > 0), countIf(accepted = 0) FROM "+db+".v_control_events").Scan(&accepted, &refused)
		// 2 kill switch + 1 quarantine + publish + pin + 10 bench = 15 mutations; refused: pin, untrusted.
		if accepted == 15 && refused == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("control_events: %d accepted mutations (want 15), %d refused (want 2)", accepted, refused)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var refusedActor string
	if err := conn.QueryRow(ctx, "SELECT actor FROM "+db+".v_control_events WHERE code = 'CTL_UNTRUSTED_KEY'").Scan(&refusedActor); err != nil || refusedActor == "" {
		t.Fatalf("refused command row: %q %v", refusedActor, err)
	}
	if out, code := run(t, talosctl, append(g, "verify", "--trusted-keys", filepath.Join(dir, "worker.pub"))...); code != 0 || !strings.Contains(out, "OK:") {
		t.Fatalf("verify with control receipts: exit %d\n%s", code, out)
	}
}
