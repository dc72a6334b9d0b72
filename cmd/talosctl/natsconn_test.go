package main

import (
	"bytes"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestCallWithNATSAuth runs talosd with its embedded, authenticated NATS,
// which requires TLS, and talosctl against it: talosctl picks the user for
// what it does from the auth file and trusts the CA beside it, explicit
// credentials and an explicit CA work, and no credentials or another CA
// are refused.
func TestCallWithNATSAuth(t *testing.T) {
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	dir := t.TempDir()
	key, _ := receipts.GenerateKey()
	if err := receipts.WriteKeyPair(key, filepath.Join(dir, "k")); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "talosd.log")
	startTalosd(t, talosd, dir, "--roles", "enforce", "--registry", "../talosd/demo/registry", "--signing-key", filepath.Join(dir, "k.key"),
		"--data-dir", dir, "--nats-listen", "127.0.0.1:0", "--http-addr", "", "--chains", "1", "--capabilities", "optional")
	urlRe := regexp.MustCompile(`embedded nats-server with JetStream"? url=((?:nats|tls)://\S+)`)
	var natsURL string
	for deadline := time.Now().Add(20 * time.Second); ; {
		out, _ := os.ReadFile(logPath)
		if m := urlRe.FindSubmatch(out); m != nil && bytes.Contains(out, []byte("enforce role started")) {
			natsURL = string(m[1])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("talosd did not start:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	auth := filepath.Join(dir, "nats-auth.json")
	var file struct{ Users []natsauth.User }
	b, err := os.ReadFile(auth)
	if err != nil || json.Unmarshal(b, &file) != nil {
		t.Fatalf("auth file: %v", err)
	}
	pw := map[string]string{}
	for _, u := range file.Users {
		pw[u.User] = u.Password
	}
	call := []string{"call", "--server", "files", "--tool", "list_directory", "--args", `{"path":"."}`, "--timeout", "5s"}

	// From the file: the enforcement user of --ep-id (default talosctl).
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL, "--nats-auth", auth}, call...)...); code != 0 || !strings.Contains(out, "ALLOW") {
		t.Fatalf("call with --nats-auth: exit %d\n%s", code, out)
	}
	// The same from the environment.
	cmd := testenv.Command(talosctl, call...)
	cmd.Env = append(os.Environ(), "TALOS_NATS_URL="+natsURL, "TALOS_NATS_AUTH="+auth)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "ALLOW") {
		t.Fatalf("call with TALOS_NATS_AUTH: %v\n%s", err, out)
	}
	// The server requires TLS: a CA that did not sign its certificate is
	// refused, and so is no CA when none is beside the users file.
	otherCA := filepath.Join(t.TempDir(), "other")
	if err := testenv.Command(talosd, "nats-tls", "--data-dir", otherCA).Run(); err != nil {
		t.Fatal(err)
	}
	otherCA = filepath.Join(otherCA, natsauth.TLSDir, natsauth.CAFile)
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL, "--nats-auth", auth, "--nats-ca", otherCA}, call...)...); code != 1 || !strings.Contains(out, "certificate") {
		t.Fatalf("call trusting another CA: exit %d, want 1 for the certificate\n%s", code, out)
	}
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL, "--nats-auth", "none"}, call...)...); code != 1 || !strings.Contains(out, "certificate") || !strings.Contains(out, "pass --nats-ca") {
		t.Fatalf("call without the CA: exit %d, want 1 for the certificate, with the flag that fixes it\n%s", code, out)
	}
	// Run elsewhere than beside talos-data: the hint names what is missing.
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL}, call...)...); code != 1 || !strings.Contains(out, "no ./talos-data/nats-auth.json here") || !strings.Contains(out, "pass --nats-auth <data dir>/nats-auth.json") {
		t.Fatalf("call without talos-data: exit %d, want 1 naming the missing users file\n%s", code, out)
	}
	// From here on the CA comes from the environment, as the flags' default
	// (talos-data/nats-auth.json here) has none beside it.
	t.Setenv("TALOS_NATS_CA", filepath.Join(dir, natsauth.TLSDir, natsauth.CAFile))
	// An ep id without a user in the file is a usage error naming the fix.
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL, "--nats-auth", auth}, append(call, "--ep-id", "stranger")...)...); code != 2 || !strings.Contains(out, "--nats-eps") {
		t.Fatalf("call as an unknown ep: exit %d, want 2\n%s", code, out)
	}
	// Explicit credentials, as flags and in the URL.
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL, "--nats-user", "ep-talosctl", "--nats-password=" + pw["ep-talosctl"]}, call...)...); code != 0 || !strings.Contains(out, "ALLOW") {
		t.Fatalf("call with --nats-user: exit %d\n%s", code, out)
	}
	u, _ := url.Parse(natsURL)
	u.User = url.UserPassword("ep-talosctl", pw["ep-talosctl"])
	if out, code := run(t, talosctl, append([]string{"--nats-url", u.String(), "--nats-auth", "none"}, call...)...); code != 0 || !strings.Contains(out, "ALLOW") {
		t.Fatalf("call with credentials in the URL: exit %d\n%s", code, out)
	}
	// Another enforcement point's user cannot read talosctl's decisions:
	// no decision, fail closed.
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL, "--nats-user", "ep-demo-ep", "--nats-password=" + pw["ep-demo-ep"]}, append(call, "--timeout", "1s")...)...); code != 1 {
		t.Fatalf("call as talosctl with demo-ep's user: exit %d, want 1\n%s", code, out)
	}
	// No credentials, or wrong ones: refused.
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL, "--nats-auth", "none"}, call...)...); code != 1 || !strings.Contains(strings.ToLower(out), "authorization") || !strings.Contains(out, "no user was given") {
		t.Fatalf("call without credentials: exit %d, want 1\n%s", code, out)
	}
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL, "--nats-user", "ep-talosctl", "--nats-password", "wrong"}, call...)...); code != 1 || strings.Contains(out, pw["ep-talosctl"]) || !strings.Contains(out, "refused --nats-user ep-talosctl") {
		t.Fatalf("call with a wrong password: exit %d, want 1 naming the user\n%s", code, out)
	}
	// Another talosd's users file: its user is refused, and the hint says
	// where users come from.
	stale := filepath.Join(t.TempDir(), "nats-auth.json")
	if err := os.WriteFile(stale, bytes.ReplaceAll(b, []byte(pw["ep-talosctl"]), []byte("stale")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := run(t, talosctl, append([]string{"--nats-url", natsURL, "--nats-auth", stale}, call...)...); code != 1 || !strings.Contains(out, "refused user ep-talosctl of "+stale) || !strings.Contains(out, "talosd --nats-eps talosctl") {
		t.Fatalf("call with another talosd's users file: exit %d, want 1 naming the user, the file and --nats-eps\n%s", code, out)
	}
	// A responder (the control commands' connection) can ask talos.ctl.>
	// and get the reply on its own inbox; a worker answers here.
	g := &Globals{NatsURL: natsURL, NatsAuth: auth}
	w, err := g.connect(schemas.NATSRoleWorker, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Subscribe(schemas.SubjectCtlAll, func(m *nats.Msg) { _ = m.Respond([]byte(`{"ok":true}`)) }); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r, err := g.connect(schemas.NATSRoleResponder, "")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if reply, err := r.Request(schemas.CtlSubject(schemas.VerbStatus), []byte(`{}`), 5*time.Second); err != nil || string(reply.Data) != `{"ok":true}` {
		t.Fatalf("responder request: %v %v", reply, err)
	}
	if _, err := (&Globals{NatsURL: natsURL, NatsAuth: auth}).connect("admin", ""); err == nil {
		t.Fatal("connect accepted an unknown role")
	}

	// bench logs in as the worker: it plays many enforcement points.
	if out, code := run(t, talosctl, "--nats-url", natsURL, "--nats-auth", auth, "bench", "--no-clickhouse", "--calls", "20", "--concurrency", "2", "--rate", "0"); code != 0 || !strings.Contains(out, "allowed 20") {
		t.Fatalf("bench: exit %d\n%s", code, out)
	}
}
