package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/talos-audit/talos/ingest/ep"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/natstls"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

func mustUser(t *testing.T, a *natsauth.File, role, ep string) natsauth.User {
	t.Helper()
	u, ok := a.Find(role, ep)
	if !ok {
		t.Fatalf("no %s user %q", role, ep)
	}
	return u
}

// TestDaemonNATSAuth runs the talosd binary with its embedded server: it
// writes the auth file (0600, kept across restarts) and a CA and server
// certificate (keys 0600, kept across restarts), admits only its users and
// only over TLS verified with that CA, and an enforcement point logged in
// from the file gets decisions. --nats-auth none turns authentication off,
// not TLS.
func TestDaemonNATSAuth(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	dir := t.TempDir()
	writeKeyPair(t, dir, "k")
	path := filepath.Join(dir, "nats-auth.json")
	args := []string{"--roles", "enforce", "--registry", "demo/registry", "--signing-key", filepath.Join(dir, "k.key"),
		"--data-dir", dir, "--nats-listen", "127.0.0.1:0", "--http-addr", "", "--nats-eps", "talosctl,gw-1"}

	url, stop := startTalosd(t, bin, dir, args...)
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("auth file: %v %v", st, err)
	}
	a, err := natsauth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Find(schemas.NATSRoleEnforcement, "gw-1"); !ok {
		t.Fatalf("no user for --nats-eps gw-1: %+v", a.Users)
	}
	tlsFiles := natstls.Layout(filepath.Join(dir, natsauth.TLSDir))
	for p, mode := range map[string]os.FileMode{tlsFiles.CA: 0o644, tlsFiles.Cert: 0o644, tlsFiles.CAKey: 0o600, tlsFiles.Key: 0o600} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != mode {
			t.Fatalf("%s: %v %v, want mode %v", p, st, err, mode)
		}
	}
	ca := nats.RootCAs(tlsFiles.CA)
	if !strings.HasPrefix(url, "tls://") {
		t.Fatalf("embedded server URL %s: want tls://", url)
	}
	if nc, err := nats.Connect(url, ca); err == nil {
		nc.Close()
		t.Fatal("the embedded server admits a client without credentials")
	}
	gw := mustUser(t, a, schemas.NATSRoleEnforcement, "gw-1").ConnectOptions()
	if nc, err := nats.Connect(url, gw...); err == nil || !strings.Contains(err.Error(), "certificate") {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("a client that does not trust the CA: %v, want refused for the certificate", err)
	}
	decide := func(url string, opts ...nats.Option) {
		t.Helper()
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		c, err := ep.NewClient(nc, js, "gw-1")
		if err != nil {
			t.Fatal(err)
		}
		call, _ := ep.NewCall("gw-1", "files", "list_directory", map[string]any{"path": "."})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := c.Call(ctx, call)
		if err != nil || d.Decision != schemas.DecisionAllow {
			t.Fatalf("call as enforcement point gw-1: %+v %v", d, err)
		}
	}
	decide(url, append(gw, ca)...)
	before, _ := os.ReadFile(path)
	tlsBefore := map[string][]byte{}
	for _, p := range []string{tlsFiles.CA, tlsFiles.CAKey, tlsFiles.Cert, tlsFiles.Key} {
		tlsBefore[p], _ = os.ReadFile(p)
	}

	// A second talosd joins with --nats-url: it logs in as the worker user
	// of --nats-auth, or of --nats-user/--nats-password; it finds the CA
	// beside --nats-auth, or takes TALOS_NATS_CA.
	worker := mustUser(t, a, schemas.NATSRoleWorker, "")
	join := []string{"--roles", "enforce", "--registry", "demo/registry", "--signing-key", filepath.Join(dir, "k.key"),
		"--data-dir", filepath.Join(dir, "second"), "--http-addr", "", "--nats-url", url}
	_, stopJoin := startTalosdLog(t, bin, filepath.Join(dir, "join.log"), append(join, "--nats-auth", path)...)
	stopJoin()
	t.Setenv("TALOS_NATS_CA", tlsFiles.CA)
	t.Setenv("TALOS_NATS_PASSWORD", worker.Password)
	_, stopJoin = startTalosdLog(t, bin, filepath.Join(dir, "join.log"), append(join, "--nats-user", worker.User)...)
	stopJoin()
	refusedLog := filepath.Join(dir, "refused.log")
	logf, err := os.Create(refusedLog)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	refused := testenv.Command(bin, append(join, "--nats-user", worker.User, "--nats-password", "wrong")...)
	refused.Stdout, refused.Stderr = logf, logf
	if err := refused.Start(); err != nil {
		t.Fatal(err)
	}
	// It exits, and its last word names the refusal.
	exited := make(chan error, 1)
	go func() { exited <- refused.Wait() }()
	select {
	case err = <-exited:
	case <-time.After(60 * time.Second):
		_ = refused.Process.Kill()
		<-exited
		out, _ := os.ReadFile(refusedLog)
		t.Fatalf("talosd with a wrong worker password did not exit:\n%s", out)
	}
	out, _ := os.ReadFile(refusedLog)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err == nil || !strings.Contains(lines[len(lines)-1], "Authorization Violation") {
		t.Fatalf("a wrong worker password is not reported on exit (%v):\n%s", err, out)
	}
	stop()

	// A restart keeps the users file and the certificates as they were.
	url, stop = startTalosd(t, bin, dir, args...)
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("restart rewrote the auth file")
	}
	for p, b := range tlsBefore {
		if after, _ := os.ReadFile(p); len(b) == 0 || !bytes.Equal(after, b) {
			t.Fatalf("restart rewrote %s", p)
		}
	}
	decide(url, append(gw, ca)...)
	stop()

	// --nats-auth none: no authentication, and a loud warning.
	log := filepath.Join(dir, "talosd.log")
	url, stop = startTalosd(t, bin, dir, append(args, "--nats-auth", "none")...)
	decide(url, ca)
	stop()
	out, _ = os.ReadFile(log)
	if !strings.Contains(string(out), "NATS AUTHENTICATION IS OFF") {
		t.Fatalf("no warning with --nats-auth none:\n%s", out)
	}
}

// startTalosd runs talosd until the embedded server's URL is logged and the
// enforce role has started; stop sends SIGTERM and waits.
func startTalosd(t *testing.T, bin, dir string, args ...string) (url string, stop func()) {
	t.Helper()
	return startTalosdLog(t, bin, filepath.Join(dir, "talosd.log"), args...)
}

// startTalosdLog is startTalosd logging to logPath; url is "" with --nats-url.
func startTalosdLog(t *testing.T, bin, logPath string, args ...string) (url string, stop func()) {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// These tests send unsigned calls: capabilities are optional here
	// (ingest and talosctl test them).
	cmd := testenv.Command(bin, append([]string{"--capabilities", "optional"}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			out, _ := os.ReadFile(logPath)
			t.Errorf("talosd exit: %v\n%s", err, out)
		}
		logf.Close()
	}
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			logf.Close()
		}
	})
	urlRe := regexp.MustCompile(`embedded nats-server with JetStream"? url=((?:nats|tls)://\S+)`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _ := os.ReadFile(logPath)
		if bytes.Contains(out, []byte("enforce role started")) {
			if m := urlRe.FindSubmatch(out); m != nil {
				return string(m[1]), stop
			}
			return "", stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("talosd did not start:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNATSAuthCommand: `talosd nats-auth` (docker-compose's natsauth job)
// writes the users file and the nats-server include, both 0600, and keeps
// existing users when run again.
func TestNATSAuthCommand(t *testing.T) {
	bin := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	dir := t.TempDir()
	path, conf := filepath.Join(dir, "nats-auth.json"), filepath.Join(dir, "auth.conf")
	run := func(eps string) string {
		t.Helper()
		out, err := testenv.Command(bin, "nats-auth", "--nats-auth", path, "--nats-eps", eps, "--conf", conf).CombinedOutput()
		if err != nil {
			t.Fatalf("talosd nats-auth: %v\n%s", err, out)
		}
		return string(out)
	}
	out := run("gw-1")
	if !strings.Contains(out, "ep-gw-1: enforcement ep_id gw-1 (new)") || !strings.Contains(out, "talosd: worker (new)") {
		t.Fatalf("output:\n%s", out)
	}
	first, _ := natsauth.Load(path)
	out = run("gw-1,gw-2")
	if strings.Contains(out, "gw-1 (new)") || !strings.Contains(out, "ep-gw-2: enforcement ep_id gw-2 (new)") {
		t.Fatalf("second run output:\n%s", out)
	}
	second, err := natsauth.Load(path)
	if err != nil || !reflect.DeepEqual(second.Users[:len(first.Users)], first.Users) {
		t.Fatalf("second run changed existing users: %v", err)
	}
	for _, p := range []string{path, conf} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", p, st, err)
		}
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil || len(opts.Users) != len(second.Users) {
		t.Fatalf("nats-server reads %s: %v", conf, err)
	}
	if out, err := testenv.Command(bin, "nats-auth", "--nats-auth", "none").CombinedOutput(); err == nil {
		t.Fatalf("nats-auth --nats-auth none succeeded:\n%s", out)
	}
}
