package receipts

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/talos-audit/talos/schemas"
)

// PrivateKey is a signing key with its key id.
type PrivateKey struct {
	KID string
	Key ed25519.PrivateKey
}

// Public returns the public half of k.
func (k *PrivateKey) Public() ed25519.PublicKey {
	return k.Key.Public().(ed25519.PublicKey)
}

// KeySet maps a key id to a trusted public key.
type KeySet map[string]ed25519.PublicKey

// Add puts pub into the set under its key id and returns the id.
func (ks KeySet) Add(pub ed25519.PublicKey) string {
	kid := KeyID(pub)
	ks[kid] = pub
	return kid
}

// KeyID is the key id of a public key: the first 16 lowercase hex
// characters of sha256(pub).
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// GenerateKey returns a new random Ed25519 signing key.
func GenerateKey() (*PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("receipts: generate key: %w", err)
	}
	return &PrivateKey{KID: KeyID(priv.Public().(ed25519.PublicKey)), Key: priv}, nil
}

// NewKeyFromSeed returns the signing key for a 32-byte Ed25519 seed.
func NewKeyFromSeed(seed []byte) (*PrivateKey, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("receipts: seed is %d bytes, want %d", len(seed), ed25519.SeedSize)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	return &PrivateKey{KID: KeyID(priv.Public().(ed25519.PublicKey)), Key: priv}, nil
}

// keyFile is the JSON form of NAME.key and NAME.pub (DESIGN.md §4).
type keyFile struct {
	Alg        string `json:"alg"`
	KID        string `json:"kid"`
	PrivateKey string `json:"private_key,omitempty"`
	PublicKey  string `json:"public_key,omitempty"`
}

// WriteOptions controls WriteKeyPairOpts. The zero value refuses to
// overwrite existing files.
type WriteOptions struct {
	Overwrite bool
}

// ErrKeyFileExists is returned when a key file exists and overwriting was
// not asked for.
var ErrKeyFileExists = errors.New("receipts: key file exists")

// WriteKeyPair writes NAME.key (mode 0600: alg, kid and the base64url seed)
// and NAME.pub (mode 0644: alg, kid and the base64url public key). It
// refuses to overwrite either file; see WriteKeyPairOpts.
func WriteKeyPair(k *PrivateKey, name string) error {
	return WriteKeyPairOpts(k, name, WriteOptions{})
}

// WriteKeyPairOpts is WriteKeyPair with options. Without Overwrite it
// writes neither file if either exists.
func WriteKeyPairOpts(k *PrivateKey, name string, opts WriteOptions) error {
	if k == nil || len(k.Key) != ed25519.PrivateKeySize {
		return errors.New("receipts: write key pair: invalid key")
	}
	pub := k.Public()
	if kid := KeyID(pub); k.KID != kid {
		return fmt.Errorf("receipts: write key pair: kid %q does not match the key (want %q)", k.KID, kid)
	}
	privJSON, err := json.MarshalIndent(keyFile{Alg: schemas.SignatureAlg, KID: k.KID,
		PrivateKey: base64.RawURLEncoding.EncodeToString(k.Key.Seed())}, "", "  ")
	if err != nil {
		return err
	}
	pubJSON, err := json.MarshalIndent(keyFile{Alg: schemas.SignatureAlg, KID: k.KID,
		PublicKey: base64.RawURLEncoding.EncodeToString(pub)}, "", "  ")
	if err != nil {
		return err
	}
	keyPath, pubPath := name+".key", name+".pub"
	if !opts.Overwrite {
		for _, p := range []string{keyPath, pubPath} {
			if _, err := os.Lstat(p); err == nil {
				return fmt.Errorf("%w: %s", ErrKeyFileExists, p)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("receipts: %s: %w", p, err)
			}
		}
	}
	if err := writeFileMode(keyPath, append(privJSON, '\n'), 0o600, opts.Overwrite); err != nil {
		return err
	}
	if err := writeFileMode(pubPath, append(pubJSON, '\n'), 0o644, opts.Overwrite); err != nil {
		if !opts.Overwrite {
			os.Remove(keyPath) // do not leave half a pair we created
		}
		return err
	}
	return nil
}

// writeFileMode writes data to path with exactly mode perm. Without
// overwrite it fails if path exists; with it, it replaces path atomically.
func writeFileMode(path string, data []byte, perm os.FileMode, overwrite bool) error {
	var f *os.File
	var err error
	if overwrite {
		f, err = os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	} else {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	}
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: %s", ErrKeyFileExists, path)
		}
		return fmt.Errorf("receipts: %s: %w", path, err)
	}
	target := f.Name()
	err = f.Chmod(perm) // exact mode, whatever the umask
	if _, werr := f.Write(data); err == nil {
		err = werr
	}
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && overwrite {
		err = os.Rename(target, path)
	}
	if err != nil {
		os.Remove(target)
		return fmt.Errorf("receipts: %s: %w", path, err)
	}
	return nil
}

func readKeyFile(path string) (*keyFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("receipts: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var kf keyFile
	if err := dec.Decode(&kf); err != nil {
		return nil, fmt.Errorf("receipts: %s: not a Talos key file: %w", path, err)
	}
	if kf.Alg != schemas.SignatureAlg {
		return nil, fmt.Errorf("receipts: %s: alg %q, want %q", path, kf.Alg, schemas.SignatureAlg)
	}
	return &kf, nil
}

// LoadPrivateKey reads a NAME.key file written by WriteKeyPair. The kid in
// the file must match the key.
func LoadPrivateKey(path string) (*PrivateKey, error) {
	kf, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	if kf.PrivateKey == "" {
		return nil, fmt.Errorf("receipts: %s: no private_key (is this a .pub file?)", path)
	}
	seed, err := base64.RawURLEncoding.DecodeString(kf.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("receipts: %s: private_key is not base64url without padding: %w", path, err)
	}
	k, err := NewKeyFromSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("receipts: %s: %w", path, err)
	}
	if kf.KID != k.KID {
		return nil, fmt.Errorf("receipts: %s: kid %q does not match the key (its kid is %q)", path, kf.KID, k.KID)
	}
	return k, nil
}

// LoadPublicKey reads one NAME.pub file and returns its key id and key.
func LoadPublicKey(path string) (string, ed25519.PublicKey, error) {
	kf, err := readKeyFile(path)
	if err != nil {
		return "", nil, err
	}
	if kf.PrivateKey != "" {
		return "", nil, fmt.Errorf("receipts: %s: holds a private key; trust the .pub file instead", path)
	}
	raw, err := base64.RawURLEncoding.DecodeString(kf.PublicKey)
	if err != nil {
		return "", nil, fmt.Errorf("receipts: %s: public_key is not base64url without padding: %w", path, err)
	}
	if len(raw) != ed25519.PublicKeySize {
		return "", nil, fmt.Errorf("receipts: %s: public_key is %d bytes, want %d", path, len(raw), ed25519.PublicKeySize)
	}
	pub := ed25519.PublicKey(raw)
	if kid := KeyID(pub); kf.KID != kid {
		return "", nil, fmt.Errorf("receipts: %s: kid %q does not match the key (its kid is %q)", path, kf.KID, kid)
	}
	return kf.KID, pub, nil
}

// LoadTrustedKeys reads the trusted public keys. Each path is a .pub file
// or a directory whose *.pub files (not sub-directories) are all read. It
// fails if any file is bad, if a directory holds no .pub file, or if no
// key results.
func LoadTrustedKeys(paths ...string) (KeySet, error) {
	ks := KeySet{}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("receipts: trusted keys: %w", err)
		}
		files := []string{p}
		if st.IsDir() {
			entries, err := os.ReadDir(p)
			if err != nil {
				return nil, fmt.Errorf("receipts: trusted keys: %w", err)
			}
			files = files[:0]
			for _, e := range entries {
				if !e.IsDir() && strings.HasSuffix(e.Name(), ".pub") {
					files = append(files, filepath.Join(p, e.Name()))
				}
			}
			if len(files) == 0 {
				return nil, fmt.Errorf("receipts: trusted keys: directory %s holds no .pub file", p)
			}
			sort.Strings(files)
		}
		for _, f := range files {
			kid, pub, err := LoadPublicKey(f)
			if err != nil {
				return nil, err
			}
			ks[kid] = pub
		}
	}
	if len(ks) == 0 {
		return nil, errors.New("receipts: trusted keys: none given")
	}
	return ks, nil
}

// WritePublicKey writes pub as a .pub key file (mode 0644) at path, unless
// a file is already there: it returns ErrKeyFileExists then, which callers
// that keep a directory of every key they ever signed with can ignore.
func WritePublicKey(pub ed25519.PublicKey, path string) error {
	if len(pub) != ed25519.PublicKeySize {
		return errors.New("receipts: write public key: invalid key")
	}
	b, err := json.MarshalIndent(keyFile{Alg: schemas.SignatureAlg, KID: KeyID(pub),
		PublicKey: base64.RawURLEncoding.EncodeToString(pub)}, "", "  ")
	if err != nil {
		return err
	}
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%w: %s", ErrKeyFileExists, path)
	}
	return writeFileMode(path, append(b, '\n'), 0o644, false)
}
