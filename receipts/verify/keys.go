package verify

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/talos-audit/talos/schemas"
)

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

// KeyFile is the JSON form of NAME.key and NAME.pub (DESIGN.md §4); the
// producer side (package receipts) writes and reads the private half.
type KeyFile struct {
	Alg        string `json:"alg"`
	KID        string `json:"kid"`
	PrivateKey string `json:"private_key,omitempty"`
	PublicKey  string `json:"public_key,omitempty"`
}

// ReadKeyFile reads and checks the form of a NAME.key or NAME.pub file.
func ReadKeyFile(path string) (*KeyFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var kf KeyFile
	if err := dec.Decode(&kf); err != nil {
		return nil, fmt.Errorf("verify: %s: not a Talos key file: %w", path, err)
	}
	if kf.Alg != schemas.SignatureAlg {
		return nil, fmt.Errorf("verify: %s: alg %q, want %q", path, kf.Alg, schemas.SignatureAlg)
	}
	return &kf, nil
}

// LoadPublicKey reads one NAME.pub file and returns its key id and key.
func LoadPublicKey(path string) (string, ed25519.PublicKey, error) {
	kf, err := ReadKeyFile(path)
	if err != nil {
		return "", nil, err
	}
	if kf.PrivateKey != "" {
		return "", nil, fmt.Errorf("verify: %s: holds a private key; trust the .pub file instead", path)
	}
	raw, err := base64.RawURLEncoding.DecodeString(kf.PublicKey)
	if err != nil {
		return "", nil, fmt.Errorf("verify: %s: public_key is not base64url without padding: %w", path, err)
	}
	if len(raw) != ed25519.PublicKeySize {
		return "", nil, fmt.Errorf("verify: %s: public_key is %d bytes, want %d", path, len(raw), ed25519.PublicKeySize)
	}
	pub := ed25519.PublicKey(raw)
	if kid := KeyID(pub); kf.KID != kid {
		return "", nil, fmt.Errorf("verify: %s: kid %q does not match the key (its kid is %q)", path, kf.KID, kid)
	}
	return kf.KID, pub, nil
}

// LoadTrustedKeys is LoadKeys where at least one key is needed (a
// verifier with no key could only fail): it also fails if no key results.
func LoadTrustedKeys(paths ...string) (KeySet, error) {
	ks, err := LoadKeys(paths...)
	if err == nil && len(ks) == 0 {
		err = errors.New("verify: trusted keys: none given")
	}
	return ks, err
}

// LoadKeys reads public keys. Each path is a .pub file or a directory
// whose *.pub files (not sub-directories) are all read. It fails if any
// file is bad or a directory holds no .pub file; no paths is an empty set
// (for settings where trusting no key is allowed).
func LoadKeys(paths ...string) (KeySet, error) {
	ks := KeySet{}
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("verify: trusted keys: %w", err)
		}
		files := []string{p}
		if st.IsDir() {
			entries, err := os.ReadDir(p)
			if err != nil {
				return nil, fmt.Errorf("verify: trusted keys: %w", err)
			}
			files = files[:0]
			for _, e := range entries {
				if !e.IsDir() && strings.HasSuffix(e.Name(), ".pub") {
					files = append(files, filepath.Join(p, e.Name()))
				}
			}
			if len(files) == 0 {
				return nil, fmt.Errorf("verify: trusted keys: directory %s holds no .pub file", p)
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
	return ks, nil
}
