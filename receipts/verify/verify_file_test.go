package verify_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talos-audit/talos/receipts/verify"
)

// ReadEventsFile reads a file, or the given standard input for "-".
func TestReadEventsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	if err := os.WriteFile(path, []byte("{\"id\":\"a\"}\n\n{\"id\":\"b\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := verify.ReadEventsFile(path, strings.NewReader("unused"))
	if err != nil || len(evs) != 2 || string(evs[1]) != `{"id":"b"}` {
		t.Fatalf("file: %q %v", evs, err)
	}
	evs, err = verify.ReadEventsFile("-", strings.NewReader(`[{"id":"c"}]`))
	if err != nil || len(evs) != 1 || string(evs[0]) != `{"id":"c"}` {
		t.Fatalf("stdin: %q %v", evs, err)
	}
	if _, err := verify.ReadEventsFile(filepath.Join(t.TempDir(), "none"), nil); err == nil {
		t.Fatal("a missing file: no error")
	}
}
