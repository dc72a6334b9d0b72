package enforce

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// ReadManifestFiles reads a file as is, a directory's *.json files sorted
// (nothing else, not recursively), and reports a directory without one;
// LoadRegistry keeps its own wording for that.
func TestReadManifestFiles(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"b.json": "B", "a.json": "A", "notes.txt": "x", "sub/c.json": "C"} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	files, err := ReadManifestFiles(dir)
	if err != nil || len(files) != 2 || files[0].Path != filepath.Join(dir, "a.json") || string(files[0].Raw) != "A" || string(files[1].Raw) != "B" {
		t.Fatalf("directory: %+v, %v", files, err)
	}
	one := filepath.Join(dir, "notes.txt")
	if files, err = ReadManifestFiles(one); err != nil || len(files) != 1 || files[0].Path != one {
		t.Fatalf("one file: %+v, %v", files, err)
	}
	empty := filepath.Join(dir, "sub", "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadManifestFiles(empty); !errors.Is(err, ErrNoManifests) || err.Error() != empty+": no *.json manifests" {
		t.Fatalf("empty directory: %v", err)
	}
	if _, err := LoadRegistry(empty); err == nil || err.Error() != "enforce: registry "+empty+": no *.json manifests" {
		t.Fatalf("LoadRegistry of an empty directory: %v", err)
	}
	if _, err := ReadManifestFiles(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
}
