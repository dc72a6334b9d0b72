package web

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLoadOrCreateToken: the token file is created once (0600, 64 hex,
// directories made), then reused; an empty file is an error naming it.
func TestLoadOrCreateToken(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	path := filepath.Join(dir, "data", "web.token")
	tok, err := LoadOrCreateToken(path, log)
	if err != nil || !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(tok) || !ValidToken(tok) {
		t.Fatalf("new token: %v (%d chars)", err, len(tok))
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", st, err)
	}
	if again, err := LoadOrCreateToken(path, log); err != nil || again != tok {
		t.Fatalf("second start: a different token (%v)", err)
	}
	empty := filepath.Join(dir, "empty.token")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateToken(empty, log); err == nil || !strings.Contains(err.Error(), empty) {
		t.Fatalf("empty token file: %v", err)
	}
}
