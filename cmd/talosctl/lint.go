package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/enforce/registrylint"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/schemas"
)

// registryLintCmd is the completeness test of CM-COMPLETE run against a live
// server: what the upstream's tools/list offers that the registry does not
// classify (a call to it would be denied in prod, or classified wrongly).
// It needs no NATS: it reads manifest files and talks MCP to the upstream.
type registryLintCmd struct {
	Server        string        `name:"server" required:"" help:"The upstream: <server_id>=<http(s) URL> (streamable HTTP) or <server_id>=<command> [args...] (stdio; \"...\" and '...' quote)."`
	Registry      string        `name:"registry" type:"path" help:"Manifest file or directory of *.json manifests (as talosd --registry). Without it, or without a manifest for the server, every live tool is MISSING."`
	ServerID      string        `name:"server-id" help:"Compare with this server_id's manifest instead of the one --server names (--server may then omit its '<server_id>=')."`
	Timeout       time.Duration `name:"timeout" default:"30s" help:"Limit for starting or reaching the server and listing its tools."`
	WriteSkeleton string        `name:"write-skeleton" type:"path" placeholder:"FILE" help:"Write a manifest skeleton with the missing tools to FILE (which must not exist): tool_class suggested from readOnlyHint, trust_level unknown. Review before publishing."`
	WritePins     bool          `name:"write-pins" help:"Pin the definitions the server lists now: set definition_sha256 of its tools in the --registry manifest file (rewritten, indented), then lint against it. Review the live definitions first; publish and pin the registry afterwards."`
}

func (c *registryLintCmd) Run(g *Globals) error {
	spec, manifestID, err := c.check()
	if err != nil {
		return err
	}
	rep := registrylint.Report{ServerID: manifestID, Server: spec.String(), Registry: c.Registry}
	manifest, err := c.manifest(&rep)
	if err != nil {
		return err
	}
	if !rep.ManifestFound && !g.JSON {
		if c.Registry == "" {
			fmt.Printf("note: no --registry: every tool of %s is reported MISSING\n", manifestID)
		} else {
			fmt.Printf("note: %s has no manifest for server_id %s: every tool is reported MISSING\n", c.Registry, manifestID)
		}
	}
	live, err := c.listTools(spec, &rep)
	if err != nil {
		return err
	}
	if c.WritePins {
		if manifest, err = c.writePins(&rep, live); err != nil {
			return err
		}
	}
	registrylint.Lint(&rep, manifest, live, mcpup.ActionEnum)
	if c.WriteSkeleton != "" && rep.Counts[registrylint.Missing] > 0 {
		if err := writeSkeleton(c.WriteSkeleton, &rep); err != nil {
			return failed("registry lint: --write-skeleton: %v", err)
		}
		rep.Skeleton = c.WriteSkeleton
	}
	if g.JSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := printLint(os.Stdout, &rep, c.WriteSkeleton); err != nil {
		return err
	}
	if !rep.OK {
		return failed("registry lint: server %s: %d tool(s) and %d action(s) missing from the registry, %d definition(s) drifted from their pins",
			manifestID, rep.Counts[registrylint.Missing], rep.Counts[registrylint.MissingAction], rep.Counts[registrylint.Drift])
	}
	return nil
}

// check reads the flags: the server to call and the server_id whose
// manifest it is compared with.
func (c *registryLintCmd) check() (mcpup.Spec, string, error) {
	spec, err := c.spec()
	if err != nil {
		return spec, "", usage("registry lint: --server: %v", err)
	}
	if c.Timeout <= 0 {
		return spec, "", usage("registry lint: --timeout must be positive")
	}
	manifestID := spec.ServerID
	if c.ServerID != "" {
		if !schemas.ValidID(c.ServerID) {
			return spec, "", usage("registry lint: --server-id %q must match %s", c.ServerID, schemas.IDPattern)
		}
		manifestID = c.ServerID
	}
	if c.WritePins && c.Registry == "" {
		return spec, "", usage("registry lint: --write-pins needs --registry (the manifest to pin)")
	}
	if c.WriteSkeleton != "" {
		if _, err := os.Lstat(c.WriteSkeleton); err == nil {
			return spec, "", usage("registry lint: --write-skeleton %s already exists (it is never overwritten)", c.WriteSkeleton)
		}
	}
	return spec, manifestID, nil
}

// manifest loads --registry and returns rep.ServerID's manifest (an empty
// one when there is none), noting the digest and whether it was found.
func (c *registryLintCmd) manifest(rep *registrylint.Report) (*schemas.Manifest, error) {
	manifest := &schemas.Manifest{ServerID: rep.ServerID}
	if c.Registry == "" {
		return manifest, nil
	}
	reg, err := enforce.LoadRegistry(c.Registry)
	if err != nil {
		return nil, failed("registry lint: %v", err)
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

// writePins sets the pins of rep.ServerID's manifest file to the live
// definitions and returns the manifest as written.
func (c *registryLintCmd) writePins(rep *registrylint.Report, live []*mcp.Tool) (*schemas.Manifest, error) {
	if !rep.ManifestFound {
		return nil, failed("registry lint: --write-pins: %s has no manifest for server_id %s", c.Registry, rep.ServerID)
	}
	file, raw, err := manifestFile(c.Registry, rep.ServerID)
	if err != nil {
		return nil, failed("registry lint: --write-pins: %v", err)
	}
	b, n, err := registrylint.WritePins(raw, live)
	if err != nil {
		return nil, failed("registry lint: --write-pins: %s: %v", file, err)
	}
	if err := writeFileAtomic(file, b); err != nil {
		return nil, failed("registry lint: --write-pins: %v", err)
	}
	rep.PinsWritten, rep.PinsFile = n, file
	m, err := schemas.ParseManifest(b)
	if err != nil {
		return nil, failed("registry lint: --write-pins: %v", err)
	}
	reg, err := enforce.LoadRegistry(c.Registry)
	if err != nil {
		return nil, failed("registry lint: %v", err)
	}
	rep.RegistryDigest = reg.Digest()
	return m, nil
}

// manifestFile is the file of registry (a manifest or a directory of
// them) that holds serverID's manifest, and its bytes.
func manifestFile(registry, serverID string) (string, []byte, error) {
	files := []string{registry}
	if st, err := os.Stat(registry); err == nil && st.IsDir() {
		files, _ = filepath.Glob(filepath.Join(registry, "*.json"))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", nil, err
		}
		if m, err := schemas.ParseManifest(b); err == nil && m.ServerID == serverID {
			return f, b, nil
		}
	}
	return "", nil, fmt.Errorf("no manifest file for server_id %s in %s", serverID, registry)
}

// writeFileAtomic replaces path with b (a temporary file renamed over it,
// keeping its mode).
func writeFileAtomic(path string, b []byte) error {
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".pins-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// listTools connects to the server and lists its tools, noting its name
// and version in rep.
func (c *registryLintCmd) listTools(spec mcpup.Spec, rep *registrylint.Report) ([]*mcp.Tool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	cs, err := mcpup.Connect(ctx, spec, &mcp.Implementation{Name: "talosctl-registry-lint", Version: "1"},
		mcpup.WithTerminateWait(time.Second))
	if err != nil {
		return nil, failed("registry lint: %v", err)
	}
	defer cs.Close()
	live, err := mcpup.ListTools(ctx, cs)
	if err != nil {
		return nil, failed("registry lint: server %q: %v", spec.ServerID, err)
	}
	if info := cs.InitializeResult(); info != nil && info.ServerInfo != nil {
		rep.ServerName, rep.ServerVersion = info.ServerInfo.Name, info.ServerInfo.Version
	}
	return live, nil
}

// spec parses --server; with --server-id, a spec that does not begin with
// "<server_id>=" is taken as the URL or command of that server.
func (c *registryLintCmd) spec() (mcpup.Spec, error) {
	s, err := mcpup.ParseSpec(c.Server)
	if err == nil || c.ServerID == "" {
		return s, err
	}
	if id, _, ok := strings.Cut(c.Server, "="); ok && schemas.ValidID(strings.TrimSpace(id)) {
		return s, err // it did name a server: the error is about the rest
	}
	return mcpup.ParseSpec(c.ServerID + "=" + c.Server)
}

// writeSkeleton writes the skeleton of rep's MISSING tools to path
// (created, never overwritten).
func writeSkeleton(path string, rep *registrylint.Report) error {
	b, err := registrylint.Skeleton(rep.ServerID, rep.ServerVersion, rep.Findings)
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
	return f.Close()
}

// printLint writes the human report: one line per finding, then a summary.
func printLint(w io.Writer, rep *registrylint.Report, skeleton string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, f := range rep.Findings {
		action := "-"
		if f.Action != "" {
			action = registrylint.Printable(f.Action)
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\n", f.Kind, rep.ServerID, registrylint.Printable(f.Tool), action, f.Detail)
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
	_, err := fmt.Fprintf(w, "lint %s (%s): %d tools on the server, %d in the registry: %d missing, %d missing actions, %d drifted, %d stale, %d stale actions, %d without an action enum, %d advisories: %s\n",
		rep.ServerID, strings.TrimSpace(server), rep.LiveTools, rep.RegistryTools,
		n[registrylint.Missing], n[registrylint.MissingAction], n[registrylint.Drift], n[registrylint.Stale], n[registrylint.StaleAction],
		n[registrylint.NoActionEnum], n[registrylint.Advisory], verdict)
	if err == nil && rep.Skeleton != "" {
		_, err = fmt.Fprintf(w, "wrote a skeleton with %d tools to %s: review tool_class and trust_level before publishing\n", n[registrylint.Missing], rep.Skeleton)
	} else if err == nil && skeleton != "" {
		_, err = fmt.Fprintln(w, "nothing missing: no skeleton written")
	}
	return err
}
