package receipts

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talos-audit/talos/receipts/verify"
)

func TestKeyPairRoundTrip(t *testing.T) {
	dir := t.TempDir()
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if len(k.KID) != 16 || k.KID != verify.KeyID(k.Public()) {
		t.Fatalf("kid %q", k.KID)
	}
	name := filepath.Join(dir, "worker")
	if err := WriteKeyPair(k, name); err != nil {
		t.Fatal(err)
	}
	for path, mode := range map[string]os.FileMode{name + ".key": 0o600, name + ".pub": 0o644} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s mode %v, want %v", path, st.Mode().Perm(), mode)
		}
	}
	pubText, _ := os.ReadFile(name + ".pub")
	if strings.Contains(string(pubText), "private_key") || !strings.Contains(string(pubText), `"alg": "Ed25519"`) {
		t.Errorf(".pub content: %s", pubText)
	}
	got, err := LoadPrivateKey(name + ".key")
	if err != nil {
		t.Fatal(err)
	}
	if got.KID != k.KID || !got.Key.Equal(k.Key) {
		t.Error("loaded private key differs")
	}
	ks, err := verify.LoadTrustedKeys(name + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != 1 || !ks[k.KID].Equal(k.Public()) {
		t.Errorf("trusted keys %v", ks)
	}
}

func TestWriteKeyPairRefusesOverwrite(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "k")
	a, b := testKey(t, 1), testKey(t, 2)
	if err := WriteKeyPair(a, name); err != nil {
		t.Fatal(err)
	}
	if err := WriteKeyPair(b, name); !errors.Is(err, ErrKeyFileExists) {
		t.Fatalf("second write: %v, want ErrKeyFileExists", err)
	}
	if k, _ := LoadPrivateKey(name + ".key"); k == nil || k.KID != a.KID {
		t.Fatal("refused write changed the key")
	}
	// Only the .pub exists: still refuse, and write no .key.
	other := filepath.Join(dir, "half")
	os.WriteFile(other+".pub", []byte("x"), 0o644)
	if err := WriteKeyPair(a, other); !errors.Is(err, ErrKeyFileExists) {
		t.Fatalf("half pair: %v", err)
	}
	if _, err := os.Stat(other + ".key"); !os.IsNotExist(err) {
		t.Error(".key written although .pub existed")
	}
	if err := WriteKeyPairOpts(b, name, WriteOptions{Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	k, err := LoadPrivateKey(name + ".key")
	if err != nil || k.KID != b.KID {
		t.Fatalf("after overwrite: %v %v", k, err)
	}
	if st, _ := os.Stat(name + ".key"); st.Mode().Perm() != 0o600 {
		t.Errorf("overwritten .key mode %v", st.Mode().Perm())
	}
}

func TestLoadKeysErrors(t *testing.T) {
	dir := t.TempDir()
	k := testKey(t, 1)
	name := filepath.Join(dir, "good")
	if err := WriteKeyPair(k, name); err != nil {
		t.Fatal(err)
	}
	write := func(file, content string) string {
		p := filepath.Join(dir, file)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	goodPub, _ := os.ReadFile(name + ".pub")
	cases := map[string]struct {
		path string
		load func(string) error
		want string
	}{
		"kid mismatch pub": {write("kid.pub", strings.Replace(string(goodPub), k.KID, "0000000000000000", 1)), loadPub, "does not match"},
		"bad base64":       {write("b64.pub", `{"alg":"Ed25519","kid":"x","public_key":"!!"}`), loadPub, "base64url"},
		"short key":        {write("short.pub", `{"alg":"Ed25519","kid":"x","public_key":"AAAA"}`), loadPub, "bytes"},
		"wrong alg":        {write("alg.pub", `{"alg":"RSA","kid":"x","public_key":"AAAA"}`), loadPub, "alg"},
		"not json":         {write("junk.pub", `hello`), loadPub, "not a Talos key file"},
		"unknown field":    {write("extra.pub", `{"alg":"Ed25519","kid":"x","public_key":"AAAA","x":1}`), loadPub, "not a Talos key file"},
		"private as pub":   {name + ".key", loadPub, "private key"},
		"pub as private":   {name + ".pub", loadPriv, "no private_key"},
		"missing":          {filepath.Join(dir, "nope.pub"), loadPub, "no such file"},
		"empty dir":        {t.TempDir(), loadPub, "holds no .pub"},
	}
	for n, c := range cases {
		t.Run(n, func(t *testing.T) {
			err := c.load(c.path)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
			if !strings.Contains(c.want, "no .pub") && !strings.Contains(err.Error(), c.path) {
				t.Errorf("error %q does not name the file %s", err, c.path)
			}
		})
	}
}

func loadPub(p string) error  { _, err := verify.LoadTrustedKeys(p); return err }
func loadPriv(p string) error { _, err := LoadPrivateKey(p); return err }

func TestLoadTrustedKeysDirectory(t *testing.T) {
	dir := t.TempDir()
	a, b, c := testKey(t, 1), testKey(t, 2), testKey(t, 3)
	for name, k := range map[string]*PrivateKey{"a": a, "b": b} {
		if err := WriteKeyPair(k, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	os.Mkdir(filepath.Join(dir, "sub.pub"), 0o755) // directories are skipped
	other := t.TempDir()
	if err := WriteKeyPair(c, filepath.Join(other, "c")); err != nil {
		t.Fatal(err)
	}
	ks, err := verify.LoadTrustedKeys(dir, filepath.Join(other, "c.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ks) != 3 || ks[a.KID] == nil || ks[b.KID] == nil || ks[c.KID] == nil {
		t.Errorf("got %d keys: %v", len(ks), ks)
	}
	if _, err := verify.LoadTrustedKeys(); err == nil {
		t.Error("no paths: want error")
	}
	if ks, err := verify.LoadKeys(); err != nil || len(ks) != 0 {
		t.Errorf("LoadKeys of no paths: %v, %v; want an empty set", ks, err)
	}
	if _, err := verify.LoadKeys(filepath.Join(other, "absent.pub")); err == nil {
		t.Error("LoadKeys of a missing file: want error")
	}
}

func TestWritePublicKey(t *testing.T) {
	k := testKey(t, 3)
	path := filepath.Join(t.TempDir(), "signer.pub")
	if err := WritePublicKey(k.Public(), path); err != nil {
		t.Fatal(err)
	}
	kid, pub, err := verify.LoadPublicKey(path)
	if err != nil || kid != k.KID || !pub.Equal(k.Public()) {
		t.Fatalf("read back %q %v", kid, err)
	}
	if err := WritePublicKey(k.Public(), path); !errors.Is(err, ErrKeyFileExists) {
		t.Fatalf("second write: %v", err)
	}
}

// TestKeepPublicKey checks a signer's key directory: the first keep writes
// <kid>.pub that verifies as the key, a second keep adds nothing, and a
// directory that cannot be made is an error.
func TestKeepPublicKey(t *testing.T) {
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "signers")
	path, added, err := KeepPublicKey(dir, k)
	if err != nil || !added || filepath.Base(path) != k.KID+".pub" {
		t.Fatalf("first keep: %s %v %v", path, added, err)
	}
	kid, pub, err := verify.LoadPublicKey(path)
	if err != nil || kid != k.KID || !pub.Equal(k.Public()) {
		t.Fatalf("kept key: %s %v", kid, err)
	}
	if _, added, err := KeepPublicKey(dir, k); err != nil || added {
		t.Fatalf("second keep: added %v, err %v", added, err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := KeepPublicKey(filepath.Join(file, "sub"), k); err == nil {
		t.Fatal("keeping under a file: no error")
	}
}
