package receipts

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/talos-audit/talos/receipts/verify"
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

// GenerateKey returns a new random Ed25519 signing key.
func GenerateKey() (*PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("receipts: generate key: %w", err)
	}
	return &PrivateKey{KID: verify.KeyID(priv.Public().(ed25519.PublicKey)), Key: priv}, nil
}

// NewKeyFromSeed returns the signing key for a 32-byte Ed25519 seed.
func NewKeyFromSeed(seed []byte) (*PrivateKey, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("receipts: seed is %d bytes, want %d", len(seed), ed25519.SeedSize)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	return &PrivateKey{KID: verify.KeyID(priv.Public().(ed25519.PublicKey)), Key: priv}, nil
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
	if kid := verify.KeyID(pub); k.KID != kid {
		return fmt.Errorf("receipts: write key pair: kid %q does not match the key (want %q)", k.KID, kid)
	}
	privJSON, err := json.MarshalIndent(verify.KeyFile{Alg: schemas.SignatureAlg, KID: k.KID,
		PrivateKey: base64.RawURLEncoding.EncodeToString(k.Key.Seed())}, "", "  ")
	if err != nil {
		return err
	}
	pubJSON, err := json.MarshalIndent(verify.KeyFile{Alg: schemas.SignatureAlg, KID: k.KID,
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

// LoadPrivateKey reads a NAME.key file written by WriteKeyPair. The kid in
// the file must match the key.
func LoadPrivateKey(path string) (*PrivateKey, error) {
	kf, err := verify.ReadKeyFile(path)
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

// WritePublicKey writes pub as a .pub key file (mode 0644) at path, unless
// a file is already there: it returns ErrKeyFileExists then, which callers
// that keep a directory of every key they ever signed with can ignore.
func WritePublicKey(pub ed25519.PublicKey, path string) error {
	if len(pub) != ed25519.PublicKeySize {
		return errors.New("receipts: write public key: invalid key")
	}
	b, err := json.MarshalIndent(verify.KeyFile{Alg: schemas.SignatureAlg, KID: verify.KeyID(pub),
		PublicKey: base64.RawURLEncoding.EncodeToString(pub)}, "", "  ")
	if err != nil {
		return err
	}
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%w: %s", ErrKeyFileExists, path)
	}
	return writeFileMode(path, append(b, '\n'), 0o644, false)
}

// KeepPublicKey adds k's public key to dir, the directory of every key a
// signer ever used (so receipts signed before a rotation keep verifying),
// as <kid>.pub. added is false when that file was already there.
func KeepPublicKey(dir string, k *PrivateKey) (path string, added bool, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return dir, false, err
	}
	path = filepath.Join(dir, k.KID+".pub")
	switch err := WritePublicKey(k.Public(), path); {
	case errors.Is(err, ErrKeyFileExists):
		return path, false, nil
	case err != nil:
		return path, false, err
	}
	return path, true, nil
}
