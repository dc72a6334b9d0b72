package registrylint

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
)

// LoadManifest loads the registry at rep.Registry (a manifest file or a
// directory of *.json manifests, as enforce.LoadRegistry reads it) and
// returns the manifest of rep.ServerID, noting the registry's digest and
// whether the manifest was found. Without a registry, or without a
// manifest for the server, it returns an empty manifest: every live tool
// is then MISSING.
func (rep *Report) LoadManifest() (*schemas.Manifest, error) {
	manifest := &schemas.Manifest{ServerID: rep.ServerID}
	if rep.Registry == "" {
		return manifest, nil
	}
	reg, err := enforce.LoadRegistry(rep.Registry)
	if err != nil {
		return nil, err
	}
	rep.RegistryDigest = reg.Digest()
	for _, m := range reg.Manifests() {
		if m.ServerID == rep.ServerID {
			manifest, rep.ManifestFound = &m, true
			break
		}
	}
	return manifest, nil
}

// WriteSkeleton writes the Skeleton of rep's missing tools, prompts and
// resources to path, which
// is created and never overwritten, and records path in rep.Skeleton.
func (rep *Report) WriteSkeleton(path string) error {
	b, err := Skeleton(rep.ServerID, rep.ServerVersion, rep.Findings)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	rep.Skeleton = path
	return nil
}

// WriteText writes the report for a person: one line per finding (names
// the server chose made Printable), then a summary with the verdict and
// the skeleton written, if any. skeletonAsked says a skeleton was asked
// for, to say when there was nothing to write.
func (rep *Report) WriteText(w io.Writer, skeletonAsked bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, f := range rep.Findings {
		action := "-"
		if f.Action != "" {
			action = Printable(f.Action)
		} else if f.URI != "" {
			action = Printable(f.URI)
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\n", f.Kind, rep.ServerID, Printable(f.Tool), action, f.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	n := rep.Counts
	verdict := "ok"
	if !rep.OK {
		verdict = "FAIL"
	}
	server := rep.ServerName
	if rep.ServerVersion != "" {
		server += " " + rep.ServerVersion
	}
	if rep.PinsFile != "" {
		if _, err := fmt.Fprintf(w, "pinned the live definitions of %s in %s (%d changed): publish and pin the registry for workers and gateways to enforce them\n",
			rep.ServerID, rep.PinsFile, rep.PinsWritten); err != nil {
			return err
		}
	}
	features := ""
	if rep.features != nil {
		features = fmt.Sprintf("; %d prompts and %d resources or templates on the server, %d and %d in the registry: %d missing prompts, %d missing resources, %d stale prompts, %d stale resources",
			rep.LivePrompts, rep.LiveResources, rep.RegistryPrompts, rep.RegistryResources, n[MissingPrompt], n[MissingResource], n[StalePrompt], n[StaleResource])
	}
	_, err := fmt.Fprintf(w, "lint %s (%s): %d tools on the server, %d in the registry: %d missing, %d missing actions, %d drifted, %d invalid, %d stale, %d stale actions, %d without an action enum, %d advisories%s: %s\n",
		rep.ServerID, strings.TrimSpace(server), rep.LiveTools, rep.RegistryTools,
		n[Missing], n[MissingAction], n[Drift], n[Invalid], n[Stale], n[StaleAction], n[NoActionEnum], n[Advisory], features, verdict)
	if err == nil && rep.Skeleton != "" {
		_, err = fmt.Fprintf(w, "wrote a skeleton with %d tools, %d prompts and %d resources to %s: review tool_class and trust_level before publishing\n",
			n[Missing], n[MissingPrompt], n[MissingResource], rep.Skeleton)
	} else if err == nil && skeletonAsked {
		_, err = fmt.Fprintln(w, "nothing missing: no skeleton written")
	}
	return err
}

// WritePinsFile pins the definitions live lists in the manifest file of
// rep.Registry that holds rep.ServerID's manifest (WritePins; the file is
// replaced atomically, keeping its mode), notes the file, the pins changed
// and the new registry digest in rep, and returns the manifest as written.
func (rep *Report) WritePinsFile(live []*mcp.Tool) (*schemas.Manifest, error) {
	if !rep.ManifestFound {
		return nil, fmt.Errorf("%s has no manifest for server_id %s", rep.Registry, rep.ServerID)
	}
	files, err := enforce.ReadManifestFiles(rep.Registry)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if m, err := schemas.ParseManifest(f.Raw); err != nil || m.ServerID != rep.ServerID {
			continue
		}
		b, n, err := WritePins(f.Raw, live)
		if err == nil {
			err = replaceFile(f.Path, b)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
		rep.PinsWritten, rep.PinsFile = n, f.Path
		return rep.LoadManifest()
	}
	return nil, fmt.Errorf("no manifest file for server_id %s in %s", rep.ServerID, rep.Registry)
}

// replaceFile replaces path with b: a temporary file beside it, with its
// mode, renamed over it.
func replaceFile(path string, b []byte) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".pins-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Chmod(st.Mode().Perm())
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
