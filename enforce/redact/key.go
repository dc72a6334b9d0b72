package redact

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// KeyAlg is the "alg" of a redaction key file.
const KeyAlg = "HMAC-SHA256"

// newKeyBytes is the size of a key LoadOrCreateKey generates.
const newKeyBytes = 32

// ErrNoKey: the key file does not exist and LoadOrCreateKey was not asked
// to create it. It wraps fs.ErrNotExist.
var ErrNoKey = fmt.Errorf("redact: no redaction key file: %w", fs.ErrNotExist)

// keyFile is the on-disk form of a redaction key.
type keyFile struct {
	Alg string `json:"alg"`
	KID string `json:"kid"`
	Key string `json:"key"` // base64url, padding optional
}

// LoadOrCreateKey reads the redaction (pseudonym) key file at path, JSON
// {"alg":"HMAC-SHA256","kid":"...","key":"<base64url>"}. If the file does
// not exist and create is set, it generates a 32-byte random key with kid
// DefaultKeyID(key), writes it with mode 0600 (creating the directory with
// 0700 if needed) and returns it; two processes racing to create the same
// file end up with the same key. talosd and talosctl share the file so that
// `talosctl query secret-uses` computes the pseudonyms talosd recorded.
// Errors never include key material.
func LoadOrCreateKey(path string, create bool) (key []byte, kid string, err error) {
	key, kid, err = readKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, kid, err
	}
	if !create {
		return nil, "", ErrNoKey
	}
	key = make([]byte, newKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return nil, "", fmt.Errorf("redact: generate key: %w", err)
	}
	kid = DefaultKeyID(key)
	data, err := json.Marshal(keyFile{Alg: KeyAlg, KID: kid, Key: base64.RawURLEncoding.EncodeToString(key)})
	if err != nil {
		return nil, "", err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("redact: key directory: %w", err)
	}
	// Write a temporary file and link it into place: the key file appears
	// complete or not at all, and an existing one is never overwritten.
	tmp, err := os.CreateTemp(dir, ".redaction-key-*")
	if err != nil {
		return nil, "", fmt.Errorf("redact: create key file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, "", fmt.Errorf("redact: create key file: %w", err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return nil, "", fmt.Errorf("redact: write key file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, "", fmt.Errorf("redact: write key file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, "", fmt.Errorf("redact: write key file: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return readKey(path) // another process won the race
		}
		return nil, "", fmt.Errorf("redact: install key file: %w", err)
	}
	return key, kid, nil
}

// readKey reads and validates a key file.
func readKey(path string) ([]byte, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	var kf keyFile
	if err := json.Unmarshal(data, &kf); err != nil {
		return nil, "", fmt.Errorf("redact: key file %s is not valid JSON", path)
	}
	if kf.Alg != KeyAlg {
		return nil, "", fmt.Errorf("redact: key file %s: alg must be %q", path, KeyAlg)
	}
	key, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(kf.Key, "="))
	if err != nil {
		return nil, "", fmt.Errorf("redact: key file %s: key is not base64url", path)
	}
	if len(key) < MinKeyBytes {
		return nil, "", fmt.Errorf("redact: key file %s: key must be at least %d bytes", path, MinKeyBytes)
	}
	kid := kf.KID
	if kid == "" {
		kid = DefaultKeyID(key)
	}
	if strings.ContainsAny(kid, ": \t\r\n") {
		return nil, "", fmt.Errorf("redact: key file %s: kid must not contain ':' or whitespace", path)
	}
	return key, kid, nil
}
