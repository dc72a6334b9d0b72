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
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Registry is a validated registry bundle: one manifest per server, looked
// up by {server_id, tool_name}. It is immutable after construction and safe
// for concurrent use; values it returns MUST NOT be modified.
type Registry struct {
	manifests []schemas.Manifest // sorted by server_id
	tools     map[toolKey]*schemas.Tool
	digest    string

	// Worked out once when the bundle is built, read per call.
	versions  map[toolKey]string  // tool_version a ToolCallEvent names
	protected map[string][]string // tool name -> servers holding a protected tool of that name, sorted

	// governed are the prompts and resources (governed.go), also in
	// manifest order.
	governed      map[methodKey]*governedEntry
	governedOrder []*governedEntry
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
	files, err := ReadManifestFiles(path)
	switch {
	case errors.Is(err, ErrNoManifests):
		return nil, fmt.Errorf("enforce: registry %s: no *.json manifests", path)
	case errors.Is(err, filepath.ErrBadPattern):
		return nil, fmt.Errorf("enforce: registry %s: %w", path, err)
	case err != nil:
		return nil, fmt.Errorf("enforce: registry: %w", err)
	}
	in := make([]namedManifest, 0, len(files))
	for _, f := range files {
		in = append(in, namedManifest{name: f.Path, raw: f.Raw})
	}
	return newRegistry(in)
}

// ErrNoManifests is wrapped by ReadManifestFiles for a directory without
// a *.json file.
var ErrNoManifests = errors.New("no *.json manifests")

// ManifestFile is one registry manifest file as read: its path and bytes.
type ManifestFile struct {
	Path string
	Raw  []byte
}

// ReadManifestFiles reads the files of a registry: path itself, or every
// *.json file of the directory path (not recursive), sorted by name. It is
// what LoadRegistry reads and what `talosctl registry publish` sends. A
// directory without one is an error wrapping ErrNoManifests; the others
// are the file system's.
func ReadManifestFiles(path string) ([]ManifestFile, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := []string{path}
	if st.IsDir() {
		if files, err = filepath.Glob(filepath.Join(path, "*.json")); err != nil {
			return nil, err
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: %w", path, ErrNoManifests)
		}
		sort.Strings(files)
	}
	out := make([]ManifestFile, 0, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, ManifestFile{Path: f, Raw: b})
	}
	return out, nil
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

	r := &Registry{tools: map[toolKey]*schemas.Tool{}, governed: map[methodKey]*governedEntry{}}
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
		if err := r.addGoverned(m); err != nil {
			return nil, fmt.Errorf("enforce: registry: %w", err)
		}
	}
	r.versions = make(map[toolKey]string, len(r.tools))
	r.protected = map[string][]string{}
	for i := range r.manifests {
		m := &r.manifests[i]
		for j := range m.Tools {
			t := &m.Tools[j]
			v := t.ToolVersion
			if v == "" {
				v = m.ServerVersion
			}
			if v == "" {
				v = schemas.UnregisteredToolVersion
			}
			r.versions[toolKey{m.ServerID, t.ToolName}] = v
			if Protected(t) {
				r.protected[t.ToolName] = append(r.protected[t.ToolName], m.ServerID)
			}
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
	if v, ok := r.versions[toolKey{serverID, toolName}]; ok {
		return v
	}
	return schemas.UnregisteredToolVersion
}

// Classification is what the registry says of one call, worked out once
// per call (Classify) and shared by every check that needs it: the engine,
// the capability scope, preflight and the ToolCallEvent.
type Classification struct {
	// Tool is the registry's entry for {server_id, tool_name}; nil if the
	// tool is not in the registry.
	Tool *schemas.Tool
	// Class is the effective class ("read" or "write"): the tool's, or for
	// an action-based tool its action's; "" when unclassified (unknown
	// tool, or an action missing or not declared).
	Class string
	// Action is the string at the tool's action_pointer ("" if none).
	Action string
	// Resource is the string at the tool's resource_pointer, if
	// HasResource.
	Resource    string
	HasResource bool
	// ShadowedBy names the server whose built_in or internal tool of the
	// same name this tool shadows ("" if none).
	ShadowedBy string
	// Version is the tool_version a ToolCallEvent names.
	Version string
}

// Known reports whether the call's tool is in the registry.
func (c *Classification) Known() bool { return c.Tool != nil }

// Classify looks a call's tool up once and reads what the registry's
// pointers select in its arguments.
func (r *Registry) Classify(serverID, toolName string, args any) Classification {
	c := Classification{Version: schemas.UnregisteredToolVersion}
	t, ok := r.tools[toolKey{serverID, toolName}]
	if !ok {
		return c
	}
	c.Tool, c.Version = t, r.versions[toolKey{serverID, toolName}]
	c.ShadowedBy, _ = r.ShadowedBy(serverID, toolName)
	c.Class = t.ToolClass
	if t.ActionPointer != "" {
		c.Class = ""
		if v, found := jsonkit.ResolvePointer(args, t.ActionPointer); found {
			c.Action, _ = v.(string)
		}
		for i := range t.Actions {
			if a := &t.Actions[i]; c.Action != "" && a.Name == c.Action {
				c.Class = schemas.ClassWrite
				if a.ReadOnly {
					c.Class = schemas.ClassRead
				}
				break
			}
		}
	}
	if t.ResourcePointer != "" {
		if v, found := jsonkit.ResolvePointer(args, t.ResourcePointer); found {
			c.Resource, c.HasResource = v.(string)
		}
	}
	return c
}

// Manifests returns the manifests sorted by server_id (a fresh slice; the
// manifests themselves are shared and MUST NOT be modified).
func (r *Registry) Manifests() []schemas.Manifest {
	return append([]schemas.Manifest(nil), r.manifests...)
}

// ErrMode is returned by New for a mode other than prod or dev.
var ErrMode = errors.New("enforce: unknown mode")
