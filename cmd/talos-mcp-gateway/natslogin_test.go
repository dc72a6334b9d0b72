package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// TestNATSLoginDefault: like talosctl, a gateway started without
// --nats-auth in the directory holding talosd's talos-data logs in from
// talos-data/nats-auth.json and trusts the CA beside it, so it reaches a
// NATS that requires TLS with nothing set; and a gateway that cannot log
// in says why (here the server's certificate), not only that NATS is not
// reachable.
func TestNATSLoginDefault(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ca := os.Getenv("TALOS_NATS_CA")
	var env []string // the gateway's, without TALOS_NATS_CA
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TALOS_NATS_CA=") {
			env = append(env, kv)
		}
	}
	root := t.TempDir()
	data := filepath.Join(root, "talos-data")
	if err := os.MkdirAll(filepath.Join(data, natsauth.TLSDir), 0o700); err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, natsauth.TLSDir, natsauth.CAFile), pem, 0o600); err != nil {
		t.Fatal(err)
	}
	writeJSON(t, filepath.Join(data, "nats-auth.json"), natsauth.File{Users: []natsauth.User{
		{User: "ep-gw-default", Password: "secret-password-1", Role: schemas.NATSRoleEnforcement, EPID: "gw-default"}}})
	registry, err := filepath.Abs(s.registry)
	if err != nil {
		t.Fatal(err)
	}
	gateway := func(args ...string) *gatewaySession {
		cmd := testenv.Command(s.gateway, append([]string{"--nats-url", s.natsURL(), "--registry", registry,
			"--trusted-keys", filepath.Join(s.dir, "worker.pub"), "--upstream", "everything=" + testenv.MCPBin(t, "mcp-server-everything")}, args...)...)
		cmd.Dir, cmd.Env = root, env
		return s.connectGateway(ctx, cmd)
	}
	gw := gateway("--ep-id", "gw-default")
	gw.call(ctx, "echo", map[string]any{"message": "default login"}).mustAllow(t, "a call through the default login")

	// Without the CA, the server's certificate cannot be verified: the
	// warning names that.
	cmd := testenv.Command(s.gateway, "--nats-url", s.natsURL(), "--nats-auth", "none", "--registry", registry,
		"--ep-id", "gw-no-ca", "--upstream", "everything="+testenv.MCPBin(t, "mcp-server-everything"))
	cmd.Env = env
	logPath := filepath.Join(s.dir, "gateway-no-ca.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stderr = logf
	if _, err := cmd.StdinPipe(); err != nil { // held open: the gateway serves until the test ends
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitLog(t, logPath, `msg="NATS not reachable yet; every call is denied until it is"`)
	waitLog(t, logPath, "x509: certificate signed by unknown authority")
}
