package redact

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// PseudonymWithKeyFile computes what a Redactor with the file's key
// records, and never creates a key.
func TestPseudonymWithKeyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "redaction.key")
	if _, err := PseudonymWithKeyFile(path, "s3cret"); !errors.Is(err, ErrNoKey) {
		t.Fatalf("no key file: err = %v, want ErrNoKey", err)
	}
	if _, err := PseudonymWithKeyFile(path, "s3cret"); !errors.Is(err, ErrNoKey) {
		t.Fatalf("a key was created: err = %v", err)
	}
	key, kid, err := LoadOrCreateKey(path, true)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Key: key, KeyID: kid})
	if err != nil {
		t.Fatal(err)
	}
	got, err := PseudonymWithKeyFile(path, "s3cret")
	if err != nil || got != r.Pseudonym("s3cret") || !ValidPseudonym(got) {
		t.Fatalf("PseudonymWithKeyFile = %q, %v; want %q", got, err, r.Pseudonym("s3cret"))
	}
}

// LookupPseudonym takes a pseudonym as it is, or computes the one of a
// secret, given or read as one line.
func TestLookupPseudonym(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redaction.key")
	if _, err := LookupPseudonym("s3cret", "", path, nil); err == nil || !strings.Contains(err.Error(), "no redaction key at "+path) {
		t.Fatalf("no key: %v", err)
	}
	if _, _, err := LoadOrCreateKey(path, true); err != nil {
		t.Fatal(err)
	}
	want, err := PseudonymWithKeyFile(path, "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ secret, stdin string }{"value": {"s3cret", ""}, "line": {"-", "s3cret\r\nmore\n"},
		"last line": {"-", "s3cret"}} {
		if got, err := LookupPseudonym(c.secret, "", path, strings.NewReader(c.stdin)); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
	}
	if got, err := LookupPseudonym("", want, "/nonexistent", nil); err != nil || got != want {
		t.Errorf("a pseudonym: %q, %v", got, err)
	}
	if _, err := LookupPseudonym("", "hmac-sha256:k1:00", path, nil); err == nil || !strings.HasPrefix(err.Error(), "--pseudonym is not") {
		t.Errorf("a bad pseudonym: %v", err)
	}
	if _, err := LookupPseudonym("-", "", path, strings.NewReader("\n")); err == nil || err.Error() != "read the secret from standard input: empty" {
		t.Errorf("an empty line: %v", err)
	}
}

func TestValidPseudonym(t *testing.T) {
	hex := "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	for s, want := range map[string]bool{
		"hmac-sha256:k1:" + hex:           true,
		"hmac-sha256:k 1:" + hex:          false,
		"hmac-sha256::" + hex:             false,
		"hmac-sha256:k1:" + hex[:63]:      false,
		"hmac-sha256:k1:" + hex + "0":     false,
		"hmac-sha512:k1:" + hex:           false,
		"hmac-sha256:k1:" + "A" + hex[1:]: false,
	} {
		if got := ValidPseudonym(s); got != want {
			t.Errorf("ValidPseudonym(%q) = %v, want %v", s, got, want)
		}
	}
}
