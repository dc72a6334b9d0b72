package enforce

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gowebpki/jcs"
	"github.com/talos-audit/talos/schemas"
)

// Registry is a validated registry bundle: one manifest per server, looked
// up by {server_id, tool_name}. It is immutable after construction and safe
// for concurrent use; values it returns MUST NOT be modified.
type Registry struct {
	manifests []schemas.Manifest // sorted by server_id
	tools     map[toolKey]*schemas.Tool
	digest    string
}

type toolKey struct{ server, tool string }

type namedManifest struct {
	name string // file name, or "manifest #i"
	raw  []byte
}

// NewRegistry validates each manifest (schemas.ParseManifest) and builds a
// bundle. Two manifests with the same server_id are an error. No manifests
// is an empty registry, under which prod denies every call.
func NewRegistry(manifests ...[]byte) (*Registry, error) {
	in := make([]namedManifest, len(manifests))
	for i, m := range manifests {
		in[i] = namedManifest{name: fmt.Sprintf("manifest #%d", i), raw: m}
	}
	return newRegistry(in)
}

// LoadRegistry reads a manifest file, or every *.json file of a directory
// (not recursive), and builds a bundle. Errors name the offending file.
func LoadRegistry(path string) (*Registry, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("enforce: registry: %w", err)
	}
	files := []string{path}
	if st.IsDir() {
		files, err = filepath.Glob(filepath.Join(path, "*.json"))
		if err != nil {
			return nil, fmt.Errorf("enforce: registry %s: %w", path, err)
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("enforce: registry %s: no *.json manifests", path)
		}
		sort.Strings(files)
	}
	in := make([]namedManifest, 0, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("enforce: registry: %w", err)
		}
		in = append(in, namedManifest{name: f, raw: b})
	}
	return newRegistry(in)
}

func newRegistry(in []namedManifest) (*Registry, error) {
	type parsed struct {
		namedManifest
		m *schemas.Manifest
	}
	ps := make([]parsed, 0, len(in))
	seen := map[string]string{}
	for _, nm := range in {
		m, err := schemas.ParseManifest(nm.raw)
		if err != nil {
			return nil, fmt.Errorf("enforce: registry %s: %w", nm.name, err)
		}
		if prev, dup := seen[m.ServerID]; dup {
			return nil, fmt.Errorf("enforce: registry %s: server_id %q already defined by %s", nm.name, m.ServerID, prev)
		}
		seen[m.ServerID] = nm.name
		ps = append(ps, parsed{nm, m})
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i].m.ServerID < ps[j].m.ServerID })

	r := &Registry{tools: map[toolKey]*schemas.Tool{}}
	var bundle strings.Builder
	bundle.WriteByte('[')
	for i, p := range ps {
		if i > 0 {
			bundle.WriteByte(',')
		}
		bundle.Write(p.raw)
		r.manifests = append(r.manifests, *p.m)
	}
	bundle.WriteByte(']')
	for i := range r.manifests {
		m := &r.manifests[i]
		for j := range m.Tools {
			r.tools[toolKey{m.ServerID, m.Tools[j].ToolName}] = &m.Tools[j]
		}
	}
	canon, err := jcs.Transform([]byte(bundle.String()))
	if err != nil {
		return nil, fmt.Errorf("enforce: registry: canonicalise bundle: %w", err)
	}
	sum := sha256.Sum256(canon)
	r.digest = "sha256:" + hex.EncodeToString(sum[:])
	return r, nil
}

// Digest identifies the bundle: "sha256:" + hex sha256 of the RFC 8785
// canonical JSON of the array of manifests, as given (no defaults filled
// in), sorted by server_id. It does not depend on file order, whitespace or
// key order, so workers and enforcement points can pin and compare it.
func (r *Registry) Digest() string { return r.digest }

// Lookup finds a tool by {server_id, tool_name} (exact match).
func (r *Registry) Lookup(serverID, toolName string) (*schemas.Tool, bool) {
	t, ok := r.tools[toolKey{serverID, toolName}]
	return t, ok
}

// ToolVersion is the tool_version a ToolCallEvent names for {server_id,
// tool_name}: the tool's tool_version, else its manifest's server_version,
// else schemas.UnregisteredToolVersion (also for unclassified tools).
func (r *Registry) ToolVersion(serverID, toolName string) string {
	if t, ok := r.tools[toolKey{serverID, toolName}]; ok && t.ToolVersion != "" {
		return t.ToolVersion
	}
	for i := range r.manifests {
		if m := &r.manifests[i]; m.ServerID == serverID {
			if _, ok := r.tools[toolKey{serverID, toolName}]; ok && m.ServerVersion != "" {
				return m.ServerVersion
			}
			break
		}
	}
	return schemas.UnregisteredToolVersion
}

// Manifests returns the manifests sorted by server_id (a fresh slice; the
// manifests themselves are shared and MUST NOT be modified).
func (r *Registry) Manifests() []schemas.Manifest {
	return append([]schemas.Manifest(nil), r.manifests...)
}

// ErrMode is returned by New for a mode other than prod or dev.
var ErrMode = errors.New("enforce: unknown mode")
