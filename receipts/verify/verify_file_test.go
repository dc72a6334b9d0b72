package verify_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/talos-audit/talos/receipts/verify"
)

// ReadEventsFile reads a file of JSON lines or of one JSON array.
func TestReadEventsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	if err := os.WriteFile(path, []byte("{\"id\":\"a\"}\n\n{\"id\":\"b\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := verify.ReadEventsFile(path)
	if err != nil || len(evs) != 2 || string(evs[1]) != `{"id":"b"}` {
		t.Fatalf("lines: %q %v", evs, err)
	}
	array := filepath.Join(t.TempDir(), "events.json")
	if err := os.WriteFile(array, []byte(` [{"id":"c"}]`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err = verify.ReadEventsFile(array)
	if err != nil || len(evs) != 1 || string(evs[0]) != `{"id":"c"}` {
		t.Fatalf("array: %q %v", evs, err)
	}
	if _, err := verify.ReadEventsFile(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("a missing file: no error")
	}
}
