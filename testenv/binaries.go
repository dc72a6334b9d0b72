package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var built struct {
	mu    sync.Mutex
	dir   string
	paths map[string]string
}

// BuildBinary builds the main package pkg (an import path such as
// "github.com/talos-audit/talos/cmd/talosd") once per test binary and
// returns the executable's path, so tests run the real programs users run.
func BuildBinary(t testing.TB, pkg string) string {
	t.Helper()
	built.mu.Lock()
	defer built.mu.Unlock()
	if p, ok := built.paths[pkg]; ok {
		return p
	}
	if built.dir == "" {
		d, err := os.MkdirTemp("", "talos-bin-*")
		if err != nil {
			t.Fatal(err)
		}
		built.dir, built.paths = d, map[string]string{}
	}
	out := filepath.Join(built.dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	built.paths[pkg] = out
	return out
}

// removeBinaries deletes what BuildBinary built; RunWithClickHouse calls it
// when the tests are done.
func removeBinaries() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
		built.dir, built.paths = "", nil
	}
}
