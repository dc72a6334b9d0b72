package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/loadgen"
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
	genKeys(t, talosctl, dir, "worker", "responder", "stranger")
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
	if out, code := run(t, talosctl, append(g, "killswitch", "set", "global", "--reason", "x")...); code != 2 || !strings.Contains(out, "--responder-key") || !strings.Contains(out, responderKeyDefault) {
		t.Fatalf("no key: exit %d\n%s", code, out)
	}

	// bench: the propagation figure.
	out, code = run(t, talosctl, append(g, "--json", "bench", "--calls", "0", "--killswitch", "5", "--responder-key", filepath.Join(dir, "responder.key"))...)
	var br struct {
		KillSwitch loadgen.KillSwitchResult `json:"killswitch"`
	}
	if err := json.Unmarshal([]byte(out), &br); err != nil || code != 0 || br.KillSwitch.Commands != 10 || br.KillSwitch.Workers != 1 || br.KillSwitch.AfterSendP99 <= 0 {
		t.Fatalf("bench --killswitch: exit %d %v\n%s", code, err, out)
	}

	// Every command above, accepted or refused, is a signed receipt in
	// ClickHouse, and verify covers them.
	ctx := context.Background()
	conn := openClickHouse(t, ctx, addr, db)
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

// approvalManifest is a community server: its calls need a human approval.
const approvalManifest = `{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "community",
 "tools": [{"tool_name": "search", "tool_class": "read", "is_document_op": false, "trust_level": "community"}]}`

// captureStdout runs fn with os.Stdout redirected and returns what it
// printed (the command's output) and its error.
func captureStdout(t *testing.T, fn func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	out := make(chan string)
	go func() { b, _ := io.ReadAll(r); out <- string(b) }()
	ferr := fn()
	os.Stdout = saved
	w.Close()
	return <-out, ferr
}

// TestApproveRejectCommands: a community tool's call (sent with the
// talosctl binary) is parked require_approval; `approve` and `reject`
// (run in process: the command table in main.go lists them) sign the
// command with the responder key and print the control seq and receipt
// (or the reply with --json); the control service refuses a second
// resolution (CTL_CONFLICT) and an id nothing awaits (CTL_NOT_FOUND), which
// exit 1; an id that is no UUID is a usage error (exit 2).
func TestApproveRejectCommands(t *testing.T) {
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	genKeys(t, talosctl, dir, "worker", "responder")
	reg := filepath.Join(dir, "registry")
	if err := os.MkdirAll(reg, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(reg, "community.json"), []byte(approvalManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	startTalosd(t, talosd, dir, "--nats-url", ns.URL(), "--roles", "enforce,control", "--registry", reg,
		"--signing-key", filepath.Join(dir, "worker.key"), "--responder-keys", filepath.Join(dir, "responder.pub"),
		"--http-addr", "", "--chains", "1", "--instance", "approval-worker", "--capabilities", "optional")
	g := []string{"--nats-url", ns.URL(), "--nats-auth", "none"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, code := run(t, talosctl, append(g, "status", "--responder-key", filepath.Join(dir, "responder.key"))...)
		if code == 0 && strings.Contains(out, "approval-worker") && strings.Contains(out, "true") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live worker: exit %d\n%s", code, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	park := func() string {
		t.Helper()
		out, code := run(t, talosctl, append(g, "--json", "call", "--server", "community", "--tool", "search", "--args", `{"q":"x"}`)...)
		var d struct {
			ToolCallID  string   `json:"tool_call_id"`
			Decision    string   `json:"decision"`
			ReasonCodes []string `json:"reason_codes"`
		}
		if err := json.Unmarshal([]byte(out), &d); err != nil || code != 0 || d.Decision != "require_approval" ||
			len(d.ReasonCodes) != 1 || d.ReasonCodes[0] != "APPROVAL_REQUIRED" {
			t.Fatalf("community call: exit %d %v\n%s", code, err, out)
		}
		return d.ToolCallID
	}
	flags := ctlFlags{signerFlags: signerFlags{ResponderKey: filepath.Join(dir, "responder.key"), Actor: "alice"}, Timeout: 10 * time.Second}
	globals := func(asJSON bool) *Globals { return &Globals{NatsURL: ns.URL(), NatsAuth: "none", JSON: asJSON} }
	exitCode := func(err error) int {
		var ee exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		if err != nil {
			return -1
		}
		return 0
	}

	first := park()
	out, err := captureStdout(t, func() error {
		return (&approveCmd{ctlFlags: flags, ToolCallID: first, Reason: "checked"}).Run(globals(false))
	})
	if err != nil || !strings.Contains(out, "approve "+first+": ok (control seq ") || !strings.Contains(out, "receipt ") {
		t.Fatalf("approve: %v\n%s", err, out)
	}
	_, err = captureStdout(t, func() error {
		return (&approveCmd{ctlFlags: flags, ToolCallID: first}).Run(globals(false))
	})
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "CTL_CONFLICT") {
		t.Fatalf("second approve: exit %d %v", exitCode(err), err)
	}

	second := park()
	out, err = captureStdout(t, func() error {
		return (&rejectCmd{ctlFlags: flags, ToolCallID: second, Reason: "not today"}).Run(globals(true))
	})
	var rep struct {
		Reply struct {
			OK        bool   `json:"ok"`
			Seq       uint64 `json:"seq"`
			ReceiptID string `json:"receipt_id"`
		} `json:"reply"`
	}
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil || !rep.Reply.OK || rep.Reply.Seq != 2 || rep.Reply.ReceiptID == "" {
		t.Fatalf("reject --json: %v\n%s", err, out)
	}
	out, err = captureStdout(t, func() error {
		return (&rejectCmd{ctlFlags: flags, ToolCallID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e", Reason: "x"}).Run(globals(true))
	})
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "CTL_NOT_FOUND") || !strings.Contains(out, `"code": "CTL_NOT_FOUND"`) {
		t.Fatalf("reject of an id nothing awaits: exit %d %v\n%s", exitCode(err), err, out)
	}
	if err := (&approveCmd{ctlFlags: flags, ToolCallID: "call-1"}).Run(globals(false)); exitCode(err) != 2 {
		t.Fatalf("approve of no UUID: exit %d %v", exitCode(err), err)
	}
}
