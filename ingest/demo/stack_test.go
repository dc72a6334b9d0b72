package demo

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// TestKeysEnsure: empty keys are generated under the key directory, keys
// the caller names are kept, and a second Ensure reuses the files.
func TestKeysEnsure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	var k Keys
	if err := k.Ensure(dir); err != nil {
		t.Fatal(err)
	}
	want := Keys{
		SigningKey:        filepath.Join(dir, "signing.key"),
		TrustedKeys:       []string{filepath.Join(dir, "signing.pub")},
		ResponderKeys:     []string{filepath.Join(dir, "responder.pub")},
		CapabilityIssuers: []string{filepath.Join(dir, IssuerKey+".pub")},
	}
	if k.SigningKey != want.SigningKey || !slices.Equal(k.TrustedKeys, want.TrustedKeys) ||
		!slices.Equal(k.ResponderKeys, want.ResponderKeys) || !slices.Equal(k.CapabilityIssuers, want.CapabilityIssuers) {
		t.Fatalf("Ensure filled in %+v, want %+v", k, want)
	}
	for _, f := range []string{"signing.key", "responder.key", IssuerKey + ".key", Agent + ".key", CapabilityFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	signing, _ := os.ReadFile(want.SigningKey)
	if err := k.Ensure(dir); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(want.SigningKey); string(again) != string(signing) {
		t.Fatal("a second Ensure replaced the signing key")
	}

	given := Keys{SigningKey: "/etc/talos/worker.key", ResponderKeys: []string{"/etc/talos/oncall.pub"}, CapabilityIssuers: []string{"/etc/talos/issuer.pub"}}
	other := filepath.Join(t.TempDir(), "keys")
	if err := given.Ensure(other); err != nil {
		t.Fatal(err)
	}
	if given.SigningKey != "/etc/talos/worker.key" || given.TrustedKeys != nil || given.ResponderKeys[0] != "/etc/talos/oncall.pub" {
		t.Fatalf("Ensure changed keys the caller named: %+v", given)
	}
	if entries, _ := os.ReadDir(other); len(entries) != 0 {
		t.Fatalf("Ensure wrote %d files though every key was named", len(entries))
	}
}

// TestBanner: the try-it commands carry the demo agent's capability, the
// secret the demo plants, the stack's addresses, and the registry in force
// with the note under it.
func TestBanner(t *testing.T) {
	var sb strings.Builder
	err := Banner{NatsURL: "tls://127.0.0.1:4222", NatsCA: "/data/nats-tls/ca.pem", Talosctl: "talosctl --nats-url nats://127.0.0.1:4222",
		ClickhouseAddr: "127.0.0.1:9000", Database: "talos", KeyDir: "/data/keys", SignersDir: "/data/keys/signers",
		Registry: "registry pin at control seq 3", RegistryDigest: "sha256:aa", RegistryNote: "--registry is not enforced"}.Write(&sb)
	if err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	for _, want := range []string{
		"NATS:        tls://127.0.0.1:4222  (TLS; clients trust the CA /data/nats-tls/ca.pem)",
		"talosctl --nats-url nats://127.0.0.1:4222 call --server files --tool read_file",
		"--capability /data/keys/" + CapabilityFile + " --agent-key /data/keys/" + Agent + ".key",
		"--value AKIA" + "DEMO7EXAMPLE2KEY",
		"clickhouse-client --host 127.0.0.1 --port 9000",
		"FROM talos.v_decisions",
		"go run ./cmd/talosctl --clickhouse-addr 127.0.0.1:9000 verify --trusted-keys /data/keys/signers",
		"  registry:    registry pin at control seq 3 (sha256:aa)\n               --registry is not enforced\n  signing key:",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("banner lacks %q:\n%s", want, out)
		}
	}
}

// TestInstallRegistry copies a registry's manifests, and only them, into a
// new directory.
func TestInstallRegistry(t *testing.T) {
	src := fstest.MapFS{"a.json": {Data: []byte(`{"a":1}`)}, "b.json": {Data: []byte(`{}`)}, "notes.txt": {Data: []byte("x")}}
	dir := filepath.Join(t.TempDir(), "registry")
	if err := InstallRegistry(src, dir); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 2 {
		t.Fatalf("installed %v (%v), want a.json and b.json", entries, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a.json")); string(b) != `{"a":1}` {
		t.Fatalf("a.json = %q", b)
	}
}
