package tlog

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
)

func TestCheckOrigin(t *testing.T) {
	for origin, ok := range map[string]bool{
		"audit.example.com/talos":   true,
		"talos.localhost/worker-1":  true,
		"example.com:8443/logs/a_b": true,
		"":                          false,
		"https://example.com/talos": false,
		"Example.com/talos":         false,
		"example.com/ta los":        false,
		"example.com/talos+1":       false,
		"example.com/":              false,
	} {
		if err := CheckOrigin(origin); (err == nil) != ok {
			t.Errorf("CheckOrigin(%q) = %v, want ok %v", origin, err, ok)
		}
		if err := CheckOrigin(origin); err != nil && !errors.Is(err, ErrBadOrigin) {
			t.Errorf("CheckOrigin(%q): %v is not ErrBadOrigin", origin, err)
		}
	}
	if o := DefaultOrigin("Host 7.example"); CheckOrigin(o) != nil {
		t.Errorf("DefaultOrigin gives %q, not a valid origin", o)
	}
}

// TestLogKey: the key is created once, named by the origin, with its
// verifier beside it; the verifier printed is the one that checks the
// log's checkpoints; a key of another origin is refused.
func TestLogKey(t *testing.T) {
	dir := t.TempDir()
	f := RoleFlags{LogOrigin: "audit.example.com/talos"}
	k1, err := f.Key(dir, "w1")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := RoleFlags{}.Key(dir, "w2") // no origin: the key's own
	if err != nil {
		t.Fatal(err)
	}
	if k1.Verifier != k2.Verifier || k2.Signer.Name() != "audit.example.com/talos" {
		t.Errorf("second load: %s, %s; want the first key", k2.Verifier, k2.Signer.Name())
	}
	vkey, err := os.ReadFile(filepath.Join(dir, "keys", "log.vkey"))
	if err != nil || strings.TrimSpace(string(vkey)) != k1.Verifier {
		t.Errorf("log.vkey = %q (%v), want %s", vkey, err, k1.Verifier)
	}
	if st, err := os.Stat(filepath.Join(dir, "keys", "log.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("log.key: %v %v", st.Mode(), err)
	}
	if _, err := (RoleFlags{LogOrigin: "other.example.com/talos"}).Key(dir, "w1"); err == nil {
		t.Error("a key named for another origin was taken")
	}
	if _, err := (RoleFlags{LogOrigin: "https://x"}).Key(t.TempDir(), "w1"); !errors.Is(err, ErrBadOrigin) {
		t.Errorf("bad origin: %v", err)
	}
	var sb strings.Builder
	if err := (RoleFlags{}).PrintVerifier(&sb, dir, "w1"); err != nil || strings.TrimSpace(sb.String()) != k1.Verifier {
		t.Errorf("PrintVerifier = %q, %v", sb.String(), err)
	}
}

// appendN opens the log in dir, appends n entries and closes it, which
// publishes a checkpoint covering them.
func appendN(t *testing.T, dir string, key *Key, n int) {
	t.Helper()
	l, err := Open(Options{Dir: dir, Key: key, CheckpointInterval: 100 * time.Millisecond, BatchAge: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var last func() (uint64, error)
	for i := range n {
		f := l.Add(ctx, []byte(strings.Repeat("e", i+1)))
		last = func() (uint64, error) { idx, err := f(); return idx.Index, err }
	}
	if _, err := last(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestOpenRefusesAnotherLog: a log is opened only with the key that signs
// its checkpoints, and by one process at a time.
func TestOpenRefusesAnotherLog(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tlog")
	key, err := LoadOrCreateKey(filepath.Join(t.TempDir(), "log.key"), "audit.example.com/talos", true)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, dir, key, 3)
	other, err := LoadOrCreateKey(filepath.Join(t.TempDir(), "log.key"), "audit.example.com/talos", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Dir: dir, Key: other}); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("open with another key: %v", err)
	}
	l, err := Open(Options{Dir: dir, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(time.Second)
	if _, err := Open(Options{Dir: dir, Key: key}); !errors.Is(err, ErrLocked) {
		t.Errorf("second open: %v, want ErrLocked", err)
	}
}

// TestHandler serves the checkpoint and tiles, a removed partial tile as
// its full tile's prefix, and nothing of the log's private state.
func TestHandler(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tlog")
	key, err := LoadOrCreateKey(filepath.Join(t.TempDir(), "log.key"), "audit.example.com/talos", true)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, dir, key, 300) // a full tile 0/000 and a partial 0/001.p/44
	srv := httptest.NewServer(Handler(dir))
	defer srv.Close()
	get := func(p string) (int, []byte) {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, cp := get("/checkpoint")
	v, _ := note.NewVerifier(key.Verifier)
	if n, err := note.Open(cp, note.VerifierList(v)); code != 200 || err != nil || !strings.HasPrefix(n.Text, "audit.example.com/talos\n300\n") {
		t.Errorf("/checkpoint: %d %v %q", code, err, cp)
	}
	full, _ := os.ReadFile(filepath.Join(dir, "tile", "0", "000"))
	if code, b := get("/tile/0/000"); code != 200 || string(b) != string(full) || len(full) != 256*32 {
		t.Errorf("/tile/0/000: %d, %d bytes", code, len(b))
	}
	if code, b := get("/tile/0/001.p/44"); code != 200 || len(b) != 44*32 {
		t.Errorf("/tile/0/001.p/44: %d, %d bytes", code, len(b))
	}
	// No partial of 0/000 is left once it is full (or never was at 10):
	// the prefix of the full tile answers.
	_ = os.Remove(filepath.Join(dir, "tile", "0", "000.p", "10"))
	if code, b := get("/tile/0/000.p/10"); code != 200 || string(b) != string(full[:320]) {
		t.Errorf("/tile/0/000.p/10: %d, %d bytes", code, len(b))
	}
	bundle, _ := os.ReadFile(filepath.Join(dir, "tile", "entries", "000"))
	if code, b := get("/tile/entries/000.p/2"); code != 200 || string(b) != string(bundle[:2+1+2+2]) {
		t.Errorf("/tile/entries/000.p/2: %d %q", code, b)
	}
	for _, p := range []string{"/.talos/cursor.json", "/.state/treeState", "/tile/../.state/treeState", "/tile/0/000/../../.talos/appender.lock", "/tile/entries"} {
		if code, _ := get(p); code != 404 {
			t.Errorf("%s: %d, want 404", p, code)
		}
	}
}
