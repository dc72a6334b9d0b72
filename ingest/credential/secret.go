package credential

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// secretSource is one secret of the configuration: read from the
// gateway's environment once, or from a file, which is read again
// whenever it changes (its size or modification time), so a secret
// rotated on disk (best: written beside and renamed over) reaches the next
// request without a restart. A file that cannot be read or is empty
// leaves the last good secret in use, and says so in the log (never the
// secret).
type secretSource struct {
	path string // "" for a secret from the environment

	mu      sync.Mutex
	value   string
	size    int64
	modTime time.Time
	failed  bool // the last read failed (logged once until it succeeds)
}

// errEmptySecret is a secret file that holds nothing but white space.
var errEmptySecret = errors.New("empty")

// fixedSecret is a secret that never changes (from the environment).
func fixedSecret(v string) *secretSource { return &secretSource{value: v} }

// fileSecret is the secret in path, read now; it fails like the first
// read does.
func fileSecret(path string) (*secretSource, error) {
	s := &secretSource{path: path}
	if err := s.read(); err != nil {
		return nil, err
	}
	return s, nil
}

// get is the secret now ("" for none).
func (s *secretSource) get() string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.path == "" {
		return s.value
	}
	st, err := os.Stat(s.path)
	if err == nil && st.Size() == s.size && st.ModTime().Equal(s.modTime) {
		return s.value
	}
	if err == nil {
		err = s.read()
	}
	if err != nil && !s.failed {
		slog.Warn("credential file unreadable: the last secret read from it stays in use", "file", s.path, "err", err)
	}
	s.failed = err != nil
	return s.value
}

// read reads the file into s (s.mu held, or s not yet shared).
func (s *secretSource) read() error {
	st, err := os.Stat(s.path)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(s.path)
	if err != nil {
		return err
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return errEmptySecret
	}
	s.value, s.size, s.modTime = v, st.Size(), st.ModTime()
	return nil
}
