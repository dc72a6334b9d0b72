package query

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An ExportFile appears at its path only on Commit, whole; Abort leaves
// the path as it was and no temporary file behind.
func TestExportFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "out.jsonl")
	if err := os.WriteFile(path, []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := CreateExportFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("new\n")); err != nil {
		t.Fatal(err)
	}
	f.Abort()
	if b, _ := os.ReadFile(path); string(b) != "old\n" {
		t.Fatalf("after Abort: %q", b)
	}
	if f, err = CreateExportFile(path); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old\n" {
		t.Fatalf("before Commit: %q", b)
	}
	if _, err := f.Write([]byte("new\n")); err != nil {
		t.Fatal(err)
	}
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new\n" {
		t.Fatalf("after Commit: %q", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("left behind: %v", entries)
	}
}

// An ExportFile's errors name the path it was given, not its temporary
// file: a directory that does not exist, and a path it cannot replace.
func TestExportFileErrorsNameThePath(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nonexistent", "x.jsonl")
	if _, err := CreateExportFile(missing); err == nil || err.Error() != "open "+missing+": no such file or directory" {
		t.Fatalf("CreateExportFile in a missing directory: %v", err)
	}
	taken := filepath.Join(dir, "taken")
	if err := os.MkdirAll(filepath.Join(taken, "full"), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := CreateExportFile(taken)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Commit(); err == nil || !strings.HasPrefix(err.Error(), "rename "+taken+": ") || strings.Contains(err.Error(), ".partial-") {
		t.Fatalf("Commit over a directory: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("left behind: %v", entries)
	}
}
