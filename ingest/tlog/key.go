package tlog

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/mod/sumdb/note"
)

// originPattern is what talosd accepts as a log origin: a schema-less URL
// of a host (lower case) and an optional path, as C2SP tlog-checkpoint
// recommends (e.g. audit.example.com/talos). It is also the name of the
// log key, so it holds no space and no '+'.
var originPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?(:[0-9]{1,5})?(/[A-Za-z0-9._~-]+)*$`)

// ErrBadOrigin is returned for an origin originPattern refuses.
var ErrBadOrigin = errors.New("not a valid log origin: want a host name and an optional path, like audit.example.com/talos (lower-case host, no scheme, no spaces, no '+')")

// CheckOrigin returns nil if origin may name a log.
func CheckOrigin(origin string) error {
	if len(origin) > 255 || !originPattern.MatchString(origin) {
		return fmt.Errorf("%q: %w", origin, ErrBadOrigin)
	}
	return nil
}

// DefaultOrigin is the origin of a log whose operator named none:
// talos.localhost/<instance>, the instance made a path segment.
func DefaultOrigin(instance string) string {
	seg := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '-'
	}, instance)
	if seg == "" {
		seg = "talosd"
	}
	return "talos.localhost/" + seg
}

// Key is the log's signing key in signed-note form; its name is the
// log's origin.
type Key struct {
	Signer note.Signer
	// Verifier is the verifier key auditors check checkpoints with
	// (note.NewVerifier's format: <origin>+<hash>+<key>).
	Verifier string
}

// LoadOrCreateKey reads the log key in path (a note private key,
// PRIVATE+KEY+<origin>+...). When path does not exist and create is set,
// it generates one named origin, writes it (mode 0600) and its verifier
// key beside it (path with .vkey for .key), and returns it. origin "" takes
// the key's own name. A key whose name is not origin is an error: the
// origin of a log never changes.
func LoadOrCreateKey(path, origin string, create bool) (*Key, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && create {
		if origin == "" {
			return nil, errors.New("tlog: no origin to create a log key for")
		}
		return createKey(path, origin)
	}
	if err != nil {
		return nil, fmt.Errorf("tlog: log key: %w", err)
	}
	s, err := note.NewSigner(strings.TrimSpace(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("tlog: log key %s: not a signed-note private key: %w", path, err)
	}
	if origin != "" && s.Name() != origin {
		return nil, fmt.Errorf("tlog: the log key %s signs for origin %q, not %q: a log keeps its origin (use a new data dir, or --log-origin %s)", path, s.Name(), origin, s.Name())
	}
	v, err := verifierOf(strings.TrimSpace(string(raw)))
	if err != nil {
		return nil, err
	}
	return &Key{Signer: s, Verifier: v}, nil
}

func createKey(path, origin string) (*Key, error) {
	if err := CheckOrigin(origin); err != nil {
		return nil, err
	}
	skey, vkey, err := note.GenerateKey(rand.Reader, origin)
	if err != nil {
		return nil, fmt.Errorf("tlog: generate log key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("tlog: log key: %w", err)
	}
	// Written whole under a temporary name, then linked into place: a
	// process starting at the same moment (talosd and `talosd log-key`)
	// either wins or reads the winner's complete key.
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	err = os.WriteFile(tmp, []byte(skey+"\n"), 0o600)
	if err == nil {
		err = os.Link(tmp, path)
		_ = os.Remove(tmp)
	}
	if errors.Is(err, fs.ErrExist) {
		return LoadOrCreateKey(path, origin, false)
	}
	if err != nil {
		return nil, fmt.Errorf("tlog: log key: %w", err)
	}
	if err := os.WriteFile(VerifierPath(path), []byte(vkey+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("tlog: log verifier key: %w", err)
	}
	s, err := note.NewSigner(skey)
	if err != nil {
		return nil, err
	}
	return &Key{Signer: s, Verifier: vkey}, nil
}

// VerifierPath is where the verifier key of the log key in path is
// written: path with .vkey in place of .key.
func VerifierPath(path string) string { return strings.TrimSuffix(path, ".key") + ".vkey" }

// verifierOf derives the verifier key from a note private key
// (PRIVATE+KEY+<name>+<hash>+<base64 of the algorithm byte and seed>).
func verifierOf(skey string) (string, error) {
	parts := strings.SplitN(skey, "+", 5)
	if len(parts) != 5 || parts[0] != "PRIVATE" || parts[1] != "KEY" {
		return "", errors.New("tlog: log key: not a signed-note private key")
	}
	return ed25519Verifier(parts[2], parts[4])
}

// ed25519Verifier is the verifier key of name for the base64 private key
// k: the algorithm byte 1 (Ed25519) and the 32-byte seed.
func ed25519Verifier(name, k string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(k)
	if err != nil || len(b) != 1+ed25519.SeedSize || b[0] != 1 {
		return "", errors.New("tlog: log key: not an Ed25519 signed-note private key")
	}
	pub := ed25519.NewKeyFromSeed(b[1:]).Public().(ed25519.PublicKey)
	return note.NewEd25519VerifierKey(name, pub)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
