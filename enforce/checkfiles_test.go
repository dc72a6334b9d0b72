package enforce_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/receipts"
)

// TestLoadFiles reads a worker's check files: the issuers counted, the
// redaction key created once, and each unusable file an error naming its
// setting.
func TestLoadFiles(t *testing.T) {
	dir := t.TempDir()
	k, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := receipts.WriteKeyPair(k, filepath.Join(dir, "issuer")); err != nil {
		t.Fatal(err)
	}
	files := enforce.CheckFiles{CapabilityIssuers: []string{filepath.Join(dir, "issuer.pub")}, RedactionKey: filepath.Join(dir, "keys", "redaction.key")}
	var o enforce.DeciderOptions
	n, kid, err := o.LoadFiles(files)
	if err != nil || n != 1 || kid == "" || o.Capabilities == nil || o.Redactor == nil {
		t.Fatalf("LoadFiles: %d issuers, kid %q, err %v", n, kid, err)
	}
	if _, kid2, err := o.LoadFiles(files); err != nil || kid2 != kid {
		t.Fatalf("second load: kid %q (first %q), err %v: the key must be kept", kid2, kid, err)
	}
	bad := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(bad, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	for flag, f := range map[string]enforce.CheckFiles{
		"capability-issuers": {CapabilityIssuers: []string{filepath.Join(dir, "absent.pub")}, RedactionKey: files.RedactionKey},
		"policy":             {Policy: bad, RedactionKey: files.RedactionKey},
		"redaction-key":      {RedactionKey: filepath.Join(bad, "key")},
	} {
		var ferr *enforce.CheckFileError
		if _, _, err := o.LoadFiles(f); !errors.As(err, &ferr) || ferr.Flag != flag {
			t.Errorf("%s: error %v", flag, err)
		}
	}
}
