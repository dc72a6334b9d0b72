package redact

import (
	"errors"
	"path/filepath"
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
