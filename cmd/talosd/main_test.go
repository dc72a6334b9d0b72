package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest"
	"github.com/talos-audit/talos/ingest/control"
	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithClickHouse(m)) }

// connectStreams connects to the NATS server at url until the test ends
// and creates talosd's streams, so that calls can be queued before talosd
// runs.
func connectStreams(t *testing.T, ctx context.Context, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, js := testenv.ConnectJS(t, url)
	if err := ingest.EnsureStreams(ctx, js, ingest.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// writeKeyPair writes a new signing key as dir/NAME.key and dir/NAME.pub.
func writeKeyPair(t *testing.T, dir, name string) *receipts.PrivateKey {
	t.Helper()
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := receipts.WriteKeyPair(key, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	return key
}

// TestDevExitAfterDemo is README command 1, scripted: `talosd dev` brings up
// embedded NATS and a private ClickHouse, sends the demo calls, and the
// receipts verify.
func TestDevExitAfterDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a ClickHouse server")
	}
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := testenv.CommandContext(ctx, bin, "dev", "--exit-after-demo", "--data-dir", dir,
		"--clickhouse-port", "0", "--nats-listen", "127.0.0.1:0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("talosd dev: %v\n%s", err, out.String())
	}
	// NATS is TLS, with the CA generated in the data dir; the demo traffic
	// got its decisions over it.
	ca := filepath.Join(dir, "nats-tls", "ca.pem")
	for _, want := range []string{"Talos dev stack is up", "TOOL_UNCLASSIFIED_DENIED,UNKNOWN_TOOL", "DOC_HASH_MISMATCH", "VAL-HTC-001", "verify: OK",
		"NO_CAPABILITY", "DENY_PATH_TRAVERSAL", "DENY_UNKNOWN_FIELDS", "NATS:        tls://127.0.0.1:", "(TLS; clients trust the CA " + ca + ")",
		"heap pretouched"} { // the embedded server's process, before it serves
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// Signed demo calls are allowed: the capability and sender signature verify.
	if !regexp.MustCompile(`read a file \(read tool\)\s+files/read_file\s+allow`).MatchString(out.String()) {
		t.Errorf("the signed demo read was not allowed:\n%s", out.String())
	}
	for _, f := range []string{"signing.key", "issuer.pub", "demo-agent.key", "demo-agent.cap.json", "redaction.key"} {
		if _, err := os.Stat(filepath.Join(dir, "keys", f)); err != nil {
			t.Errorf("dev keys: %v", err)
		}
	}
}

// TestUsageErrors: configuration mistakes exit 2 with a message naming the fix.
func TestUsageErrors(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--roles", "enforce", "--signing-key", "x.key"}, "--registry"},
		{[]string{"--roles", "enforce", "--registry", "demo/registry"}, "--signing-key"},
		{[]string{"--roles", "enforce,bogus"}, `--roles must be one of "enforce","sink","control","web","forward","log" but got "bogus"`},
		{[]string{"--mode", "staging"}, "--mode"},
	}
	for _, c := range cases {
		cmd := testenv.Command(bin, c.args...)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 {
			t.Errorf("talosd %v: %v, want exit 2\n%s", c.args, err, out)
			continue
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("talosd %v: output lacks %q:\n%s", c.args, c.want, out)
		}
	}
}

// TestSIGKILLLosesNothing kills talosd with SIGKILL while 2,000 calls are
// in flight, restarts it, and checks that every call has exactly one
// receipt in the views and that every chain still verifies.
func TestSIGKILLLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	stopMidTraffic(t, syscall.SIGKILL)
}

// TestSIGTERMMidTrafficVerifies stops talosd with SIGTERM while 2,000
// calls are in flight, as a rolling restart does, and checks the same:
// every chain's final checkpoint covers every receipt stored on it, even
// the receipts of the batches the stop interrupted.
func TestSIGTERMMidTrafficVerifies(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	stopMidTraffic(t, syscall.SIGTERM)
}

// stopMidTraffic sends sig to talosd once it has stored 100 receipts of
// 2,000 queued calls, starts it again, and checks that every call has
// exactly one receipt and that the database verifies.
func stopMidTraffic(t *testing.T, sig syscall.Signal) {
	const calls = 2000
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	key := writeKeyPair(t, dir, "signer")
	args := []string{"--data-dir", filepath.Join(dir, "data"), "--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db,
		"--registry", "demo/registry", "--signing-key", filepath.Join(dir, "signer.key"),
		"--http-addr", "", "--ack-wait", "2s", "--chains", "4", "--batch-rows", "200", "--batch-age", "50ms", "--log-format", "json"}
	start := func(name string, extra ...string) *exec.Cmd {
		cmd := testenv.Command(bin, append(slices.Clone(args), extra...)...)
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { logf.Close() })
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}

	ctx := context.Background()
	nc, js := connectStreams(t, ctx, ns.URL())
	client, err := ep.NewClient(nc, js, "crash-ep")
	if err != nil {
		t.Fatal(err)
	}
	session := "crash-" + fmt.Sprint(time.Now().UnixNano())
	for i := 0; i < calls; i++ {
		tool, argsJSON := "list_directory", map[string]any{"path": fmt.Sprint("/d/", i)}
		if i%4 == 3 {
			tool = "rm_rf" // a deny, so both kinds of decision are in flight
		}
		c, err := ep.NewCall("crash-ep", "files", tool, argsJSON)
		if err != nil {
			t.Fatal(err)
		}
		c.SessionID = session
		raw, _ := json.Marshal(c)
		if err := client.Publish(ctx, c.Phase, c.ServerID, c.ToolCallID, raw); err != nil {
			t.Fatal(err)
		}
	}

	// A graceful stop is sent to a talosd that only enforces: the sink's
	// migrations, still running when it has stored the first receipts,
	// would end with the stop's context and an exit status of 1.
	var only []string
	if sig != syscall.SIGKILL {
		only = []string{"--roles", "enforce"}
	}
	first := start("first", only...)
	audit, err := js.Stream(ctx, schemas.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	// Stop it once some receipts are stored but most calls are still
	// queued.
	deadline := time.Now().Add(60 * time.Second)
	var stored uint64
	for {
		info, err := audit.Info(ctx)
		if err == nil {
			stored = info.State.Msgs
		}
		if stored >= 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("talosd stored only %d receipts in 60 s", stored)
		}
		time.Sleep(time.Millisecond)
	}
	if err := first.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if err := first.Wait(); err != nil && sig != syscall.SIGKILL {
		log, _ := os.ReadFile(filepath.Join(dir, "first.log"))
		t.Fatalf("talosd stopped by %v: %v\n%s", sig, err, log)
	}
	info, err := audit.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs >= calls {
		t.Fatalf("all %d receipts were stored before the kill: nothing was in flight", info.State.Msgs)
	}
	t.Logf("%v with %d of %d receipts stored", sig, info.State.Msgs, calls)

	start("second")
	conn, err := query.Open(ctx, addr, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var n, distinct uint64
	deadline = time.Now().Add(90 * time.Second)
	for {
		err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count(), uniqExact(tool_call_id) FROM %s.v_decisions WHERE session_id = ?", db), session).Scan(&n, &distinct)
		if err == nil && n >= calls {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after restart: %d decisions in v_decisions, want %d (logs in %s)", n, calls, dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Give a late duplicate a moment to show up, then count again.
	time.Sleep(2 * time.Second)
	if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count(), uniqExact(tool_call_id) FROM %s.v_decisions WHERE session_id = ?", db), session).Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != calls || distinct != calls {
		t.Fatalf("v_decisions: %d rows for %d calls, want exactly %d of each", n, distinct, calls)
	}
	var receiptsPerCall uint64
	if err := conn.QueryRow(ctx, fmt.Sprintf(
		"SELECT count() FROM (SELECT tool_call_id, uniqExact(receipt_id) AS r FROM %s.receipts WHERE session_id = ? GROUP BY tool_call_id HAVING r != 1)", db), session).Scan(&receiptsPerCall); err != nil {
		t.Fatal(err)
	}
	if receiptsPerCall != 0 {
		t.Fatalf("%d calls have other than one receipt", receiptsPerCall)
	}
	keys := verify.KeySet{}
	keys.Add(key.Public())
	rep, err := query.VerifyDatabase(ctx, conn, db, keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Checked != calls {
		t.Fatalf("verify after the %v: checked %d, problems %v", sig, rep.Checked, rep.Problems)
	}
	// The sink inserted as the writer (DDL refused): the server logged its
	// inserts under that user.
	if err := conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
		t.Fatal(err)
	}
	var inserts uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.query_log WHERE user = ? AND query LIKE ?",
		query.WriterUser, "INSERT INTO `"+db+"`.`receipts`%").Scan(&inserts); err != nil {
		t.Fatal(err)
	}
	if inserts == 0 {
		t.Fatalf("no insert into %s.receipts by %s in system.query_log", db, query.WriterUser)
	}
}

// TestEmbeddedNATSAndHTTP: plain `talosd` with no --nats-url starts its own
// JetStream server, and serves /healthz and /metrics.
func TestEmbeddedNATSAndHTTP(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	dir := t.TempDir()
	writeKeyPair(t, dir, "k")
	httpAddr := testenv.FreeAddr(t)
	cmd := testenv.Command(bin, "--roles", "enforce", "--registry", "demo/registry", "--signing-key", filepath.Join(dir, "k.key"),
		"--data-dir", dir, "--nats-listen", "127.0.0.1:0", "--http-addr", httpAddr)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + httpAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, body := get("/healthz")
		if code == 200 && strings.TrimSpace(body) == "ok" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz: %d %s\n%s", code, body, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "talos_enforce_calls_total") {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	if !strings.Contains(out.String(), "embedded nats-server with JetStream") {
		t.Fatalf("no embedded NATS:\n%s", out.String())
	}
	// A clean stop on SIGTERM.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, out.String())
	}
}

// TestPinOverridesRegistryFlag is the README followed in order: a
// responder publishes and pins the demo registry (the incident section),
// then `talosd dev` restarts with --registry naming another registry (the
// gateway section). The workers keep enforcing the pin, and talosd says
// so: its log warns once with the pinned digest, its control seq and the
// commands that would put --registry in force, "registry pinned" names
// the pinned digest, and the banner shows it.
func TestPinOverridesRegistryFlag(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "talos-data")
	// The other registry: the demo's files server only.
	other := filepath.Join(dir, "my-registry")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile("demo/registry/files.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "files.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	pinned, otherReg := loadRegistry(t, "demo/registry"), loadRegistry(t, other)
	if pinned.Digest() == otherReg.Digest() {
		t.Fatal("the two registries have one digest")
	}
	dev := func(extra ...string) (stop func(), out *testenv.SyncBuffer) {
		t.Helper()
		args := append([]string{"dev", "--no-demo", "--no-web", "--data-dir", dataDir, "--nats-url", ns.URL(),
			"--clickhouse-addr", addr, "--clickhouse-database", db, "--http-addr", ""}, extra...)
		cmd := testenv.Command(bin, args...)
		out = &testenv.SyncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stop = func() {
			t.Helper()
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := <-exited; err != nil {
				t.Fatalf("talosd dev: %v\n%s", err, out.String())
			}
		}
		testenv.WaitUntil(t, 60*time.Second, 50*time.Millisecond, "the banner", func() bool {
			return strings.Contains(out.String(), "Talos dev stack is up")
		})
		return stop, out
	}

	stop, _ := dev()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	nc, _ := connectStreams(t, ctx, ns.URL())
	responder, err := receipts.LoadPrivateKey(filepath.Join(dataDir, "keys", "responder.key"))
	if err != nil {
		t.Fatal(err)
	}
	cc := control.NewControlClient(nc, responder, "alice")
	publish := cc.NewCommand(schemas.VerbRegistryPublish)
	files, err := enforce.ReadManifestFiles("demo/registry")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		publish.Manifests = append(publish.Manifests, f.Raw)
	}
	if rep, err := cc.Do(ctx, publish); err != nil || !rep.OK {
		t.Fatalf("registry publish: %v %+v", err, rep)
	}
	pin := cc.NewCommand(schemas.VerbRegistryPin)
	pin.Digest = pinned.Digest()
	rep, _, err := cc.DoAndWait(ctx, pin, 20*time.Second)
	if err != nil || !rep.OK {
		t.Fatalf("registry pin: %v %+v", err, rep)
	}
	pinSeq := fmt.Sprint(rep.Seq)
	stop()

	stop, out := dev("--registry", other)
	defer stop()
	// The worker enforces the pin, as talosctl status shows it.
	testenv.WaitUntil(t, 30*time.Second, 100*time.Millisecond, "the worker's status", func() bool {
		rep, err := cc.Do(ctx, cc.NewCommand(schemas.VerbStatus))
		return err == nil && rep.OK && len(rep.Status) == 1 && rep.Status[0].CaughtUp && rep.Status[0].RegistryDigest == pinned.Digest()
	})
	log := out.String()
	var warnings []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "--registry") {
			warnings = append(warnings, line)
		}
		if strings.Contains(line, `msg="registry pinned"`) && !strings.Contains(line, "digest="+pinned.Digest()) {
			t.Errorf("registry pinned names another digest than the pinned one %s: %s", pinned.Digest(), line)
		}
	}
	advice := "talosctl registry publish " + other + ", then talosctl registry pin " + otherReg.Digest() + " --wait"
	if len(warnings) != 1 {
		t.Fatalf("%d warnings about --registry, want 1:\n%s", len(warnings), log)
	}
	for _, want := range []string{"enforced_digest=" + pinned.Digest(), "control_seq=" + pinSeq, "only the bootstrap registry", advice} {
		if !strings.Contains(warnings[0], want) {
			t.Errorf("the warning lacks %q: %s", want, warnings[0])
		}
	}
	for _, want := range []string{"registry:    registry pin at control seq " + pinSeq + " (" + pinned.Digest() + ")\n", advice} {
		if !strings.Contains(log, want) {
			t.Errorf("the banner lacks %q:\n%s", want, log)
		}
	}
}

// loadRegistry is enforce.LoadRegistry of path, which must load.
func loadRegistry(t *testing.T, path string) *enforce.Registry {
	t.Helper()
	reg, err := enforce.LoadRegistry(path)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestDevRefusesBadRegistryFirst: talosd dev refuses a --registry it
// cannot load before it starts its ClickHouse, naming the path.
func TestDevRefusesBadRegistryFirst(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	missing := filepath.Join(t.TempDir(), "no-such-registry")
	cmd := testenv.Command(bin, "dev", "--data-dir", filepath.Join(t.TempDir(), "talos-data"), "--registry", missing)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
		t.Fatalf("talosd dev --registry %s: %v, want a failure\n%s", missing, err, out)
	}
	if !strings.Contains(string(out), "registry") || !strings.Contains(string(out), missing) {
		t.Errorf("the error does not name the registry %s:\n%s", missing, out)
	}
	if strings.Contains(string(out), "clickhouse-server") {
		t.Errorf("ClickHouse was started before the registry was checked:\n%s", out)
	}
}
