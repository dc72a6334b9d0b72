package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/cmd/internal/mcpup"
	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
)

// registryLintCmd is seed 004's completeness test run against a live
// server: what the upstream's tools/list offers that the registry does not
// classify (a call to it would be denied in prod, or classified wrongly).
// It needs no NATS: it reads manifest files and talks MCP to the upstream.
type registryLintCmd struct {
	Server        string        `name:"server" required:"" help:"The upstream: <server_id>=<http(s) URL> (streamable HTTP) or <server_id>=<command> [args...] (stdio; \"...\" and '...' quote)."`
	Registry      string        `name:"registry" type:"path" help:"Manifest file or directory of *.json manifests (as talosd --registry). Without it, or without a manifest for the server, every live tool is MISSING."`
	ServerID      string        `name:"server-id" help:"Compare with this server_id's manifest instead of the one --server names (--server may then omit its '<server_id>=')."`
	Timeout       time.Duration `name:"timeout" default:"30s" help:"Limit for starting or reaching the server and listing its tools."`
	WriteSkeleton string        `name:"write-skeleton" type:"path" placeholder:"FILE" help:"Write a manifest skeleton with the missing tools to FILE (which must not exist): tool_class suggested from readOnlyHint, trust_level unknown. Review before publishing."`
}

// Kinds of lint findings. MISSING and MISSING_ACTION fail the lint (exit 1);
// STALE, STALE_ACTION and NO_ACTION_ENUM are warnings; ADVISORY compares
// the upstream's self-reported annotations, which Talos never trusts, with
// the registry, and never fails.
const (
	lintMissing       = "MISSING"
	lintMissingAction = "MISSING_ACTION"
	lintStale         = "STALE"
	lintStaleAction   = "STALE_ACTION"
	lintNoActionEnum  = "NO_ACTION_ENUM"
	lintAdvisory      = "ADVISORY"
)

// lintKinds orders findings and gives each kind's severity.
var lintKinds = []struct{ kind, severity string }{
	{lintMissing, "error"},
	{lintMissingAction, "error"},
	{lintStale, "warning"},
	{lintStaleAction, "warning"},
	{lintNoActionEnum, "warning"},
	{lintAdvisory, "advisory"},
}

func lintSeverity(kind string) string {
	for _, k := range lintKinds {
		if k.kind == kind {
			return k.severity
		}
	}
	return "error"
}

// lintFinding is one line of the report.
type lintFinding struct {
	Kind     string `json:"kind"`
	Severity string `json:"severity"` // error | warning | advisory
	Tool     string `json:"tool"`
	Action   string `json:"action,omitempty"`
	Detail   string `json:"detail"`
	// Suggested is MISSING's suggested tool_class (from readOnlyHint).
	Suggested string `json:"suggested_tool_class,omitempty"`
}

// lintReport is the --json output.
type lintReport struct {
	ServerID       string         `json:"server_id"`
	Server         string         `json:"server"` // the spec without secrets
	ServerName     string         `json:"server_name,omitempty"`
	ServerVersion  string         `json:"server_version,omitempty"`
	Registry       string         `json:"registry,omitempty"`
	RegistryDigest string         `json:"registry_digest,omitempty"`
	ManifestFound  bool           `json:"manifest_found"`
	LiveTools      int            `json:"live_tools"`
	RegistryTools  int            `json:"registry_tools"`
	Findings       []lintFinding  `json:"findings"`
	Counts         map[string]int `json:"counts"`
	OK             bool           `json:"ok"`
	Skeleton       string         `json:"skeleton,omitempty"`
}

func (c *registryLintCmd) Run(g *Globals) error {
	spec, err := c.spec()
	if err != nil {
		return usage("registry lint: --server: %v", err)
	}
	if c.Timeout <= 0 {
		return usage("registry lint: --timeout must be positive")
	}
	manifestID := spec.ServerID
	if c.ServerID != "" {
		if !schemas.ValidID(c.ServerID) {
			return usage("registry lint: --server-id %q must match %s", c.ServerID, schemas.IDPattern)
		}
		manifestID = c.ServerID
	}
	if c.WriteSkeleton != "" {
		if _, err := os.Lstat(c.WriteSkeleton); err == nil {
			return usage("registry lint: --write-skeleton %s already exists (it is never overwritten)", c.WriteSkeleton)
		}
	}
	rep := lintReport{ServerID: manifestID, Server: spec.String(), Registry: c.Registry}
	manifest := &schemas.Manifest{ServerID: manifestID}
	if c.Registry != "" {
		reg, err := enforce.LoadRegistry(c.Registry)
		if err != nil {
			return failed("registry lint: %v", err)
		}
		rep.RegistryDigest = reg.Digest()
		for _, m := range reg.Manifests() {
			if m.ServerID == manifestID {
				manifest, rep.ManifestFound = &m, true
				break
			}
		}
	}
	if !rep.ManifestFound && !g.JSON {
		if c.Registry == "" {
			fmt.Printf("note: no --registry: every tool of %s is reported MISSING\n", manifestID)
		} else {
			fmt.Printf("note: %s has no manifest for server_id %s: every tool is reported MISSING\n", c.Registry, manifestID)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	cs, err := mcpup.Connect(ctx, spec, &mcp.Implementation{Name: "talosctl-registry-lint", Version: "1"},
		mcpup.WithTerminateWait(time.Second))
	if err != nil {
		return failed("registry lint: %v", err)
	}
	defer cs.Close()
	live, err := mcpup.ListTools(ctx, cs)
	if err != nil {
		return failed("registry lint: server %q: %v", spec.ServerID, err)
	}
	if info := cs.InitializeResult(); info != nil && info.ServerInfo != nil {
		rep.ServerName, rep.ServerVersion = info.ServerInfo.Name, info.ServerInfo.Version
	}

	rep.LiveTools, rep.RegistryTools = len(live), len(manifest.Tools)
	rep.Findings = lintTools(manifest, live)
	rep.Counts = map[string]int{}
	for _, k := range lintKinds {
		rep.Counts[k.kind] = 0
	}
	errs := 0
	for _, f := range rep.Findings {
		rep.Counts[f.Kind]++
		if f.Severity == "error" {
			errs++
		}
	}
	rep.OK = errs == 0

	if c.WriteSkeleton != "" && rep.Counts[lintMissing] > 0 {
		if err := writeSkeleton(c.WriteSkeleton, manifestID, rep.ServerVersion, rep.Findings); err != nil {
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
	if errs > 0 {
		return failed("registry lint: server %s: %d tool(s) and %d action(s) missing from the registry",
			manifestID, rep.Counts[lintMissing], rep.Counts[lintMissingAction])
	}
	return nil
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

// lintTools compares manifest m with the tools a server lists (seed 004's
// completeness test): live tools absent from m (MISSING), m's tools absent
// from the server (STALE), and for m's action-based tools the live action
// enum at action_pointer against m's actions (MISSING_ACTION, STALE_ACTION,
// NO_ACTION_ENUM), plus ADVISORY mismatches between the upstream's
// annotations and m's classification. Findings are ordered by kind (as in
// lintKinds), then tool, then action.
func lintTools(m *schemas.Manifest, live []*mcp.Tool) []lintFinding {
	out := []lintFinding{}
	add := func(kind, tool, action, detail string) {
		out = append(out, lintFinding{Kind: kind, Severity: lintSeverity(kind), Tool: tool, Action: action, Detail: detail})
	}
	registered := map[string]*schemas.Tool{}
	for i := range m.Tools {
		registered[m.Tools[i].ToolName] = &m.Tools[i]
	}
	onServer := map[string]bool{}
	for _, lt := range live {
		if lt == nil || onServer[lt.Name] {
			continue
		}
		onServer[lt.Name] = true
		rt, ok := registered[lt.Name]
		if !ok {
			class := suggestedClass(lt)
			add(lintMissing, lt.Name, "", "on the server, not in the registry: unclassified, prod denies its calls ("+hintSummary(lt.Annotations)+"; suggest tool_class "+class+")")
			out[len(out)-1].Suggested = class
			continue
		}
		lintActions(rt, lt, add)
		lintAnnotations(rt, lt, add)
	}
	for i := range m.Tools {
		if name := m.Tools[i].ToolName; !onServer[name] {
			add(lintStale, name, "", "in the registry, not on the server (renamed, removed, or hidden from this client)")
		}
	}
	order := map[string]int{}
	for i, k := range lintKinds {
		order[k.kind] = i
	}
	slices.SortStableFunc(out, func(a, b lintFinding) int {
		if d := order[a.Kind] - order[b.Kind]; d != 0 {
			return d
		}
		if d := strings.Compare(a.Tool, b.Tool); d != 0 {
			return d
		}
		return strings.Compare(a.Action, b.Action)
	})
	return out
}

// lintActions checks an action-based registry tool against the live enum.
func lintActions(rt *schemas.Tool, lt *mcp.Tool, add func(kind, tool, action, detail string)) {
	if rt.ActionPointer == "" {
		// Not declared action-based: point out an obvious action enum.
		if vals, ok := mcpup.ActionEnum(lt.InputSchema, "/action"); ok {
			add(lintAdvisory, lt.Name, "", fmt.Sprintf("the live schema has an enum of %d values at /action (%s) but the registry declares no action_pointer: every call gets tool_class %s", len(vals), printableList(vals), rt.ToolClass))
		}
		return
	}
	vals, ok := mcpup.ActionEnum(lt.InputSchema, rt.ActionPointer)
	if !ok {
		add(lintNoActionEnum, lt.Name, "", "the live schema has no enum or const at action_pointer "+rt.ActionPointer+": the registry's actions cannot be checked (calls naming another action are unclassified)")
		return
	}
	declared := map[string]bool{}
	for _, a := range rt.Actions {
		declared[a.Name] = true
	}
	inEnum := map[string]bool{}
	for _, v := range vals {
		inEnum[v] = true
		if !declared[v] {
			add(lintMissingAction, lt.Name, v, "in the live enum at "+rt.ActionPointer+", not in the registry's actions: calls with it are unclassified")
		}
	}
	for _, a := range rt.Actions {
		if !inEnum[a.Name] {
			add(lintStaleAction, lt.Name, a.Name, "in the registry's actions, not in the live enum at "+rt.ActionPointer)
		}
	}
}

// lintAnnotations compares the upstream's hints with the registry. Hints
// are the server's claims, never trusted: a mismatch is worth a look, not
// a failure.
func lintAnnotations(rt *schemas.Tool, lt *mcp.Tool, add func(kind, tool, action, detail string)) {
	a := lt.Annotations
	if a == nil {
		return
	}
	if rt.ActionPointer != "" && len(rt.Actions) > 0 {
		var writes []string
		for _, act := range rt.Actions {
			if !act.ReadOnly {
				writes = append(writes, act.Name)
			}
		}
		switch {
		case a.ReadOnlyHint && len(writes) > 0:
			add(lintAdvisory, lt.Name, "", "upstream readOnlyHint=true, but the registry classes these actions as writes (stricter than the server claims): "+strings.Join(writes, ", "))
		case !a.ReadOnlyHint && len(writes) == 0:
			add(lintAdvisory, lt.Name, "", "upstream does not claim read-only ("+hintSummary(a)+"), but the registry classifies every action as read-only")
		}
	} else {
		switch {
		case a.ReadOnlyHint && rt.ToolClass == schemas.ClassWrite:
			add(lintAdvisory, lt.Name, "", "upstream readOnlyHint=true, registry tool_class write (stricter than the server claims)")
		case !a.ReadOnlyHint && rt.ToolClass == schemas.ClassRead:
			add(lintAdvisory, lt.Name, "", "upstream does not claim read-only ("+hintSummary(a)+"), registry tool_class read")
		}
	}
	if a.OpenWorldHint != nil && rt.NetworkOutbound != nil && *a.OpenWorldHint != *rt.NetworkOutbound {
		add(lintAdvisory, lt.Name, "", fmt.Sprintf("upstream openWorldHint=%t, registry network_outbound %t", *a.OpenWorldHint, *rt.NetworkOutbound))
	}
}

// suggestedClass is the tool_class a skeleton suggests: read only when the
// server claims readOnlyHint, write otherwise (the safe default).
func suggestedClass(t *mcp.Tool) string {
	if t.Annotations != nil && t.Annotations.ReadOnlyHint {
		return schemas.ClassRead
	}
	return schemas.ClassWrite
}

// hintSummary describes the upstream's annotations for a report line.
func hintSummary(a *mcp.ToolAnnotations) string {
	if a == nil {
		return "no annotations"
	}
	parts := []string{"readOnlyHint=" + strconv.FormatBool(a.ReadOnlyHint)}
	if a.DestructiveHint != nil {
		parts = append(parts, "destructiveHint="+strconv.FormatBool(*a.DestructiveHint))
	}
	if a.OpenWorldHint != nil {
		parts = append(parts, "openWorldHint="+strconv.FormatBool(*a.OpenWorldHint))
	}
	return "upstream " + strings.Join(parts, ", ")
}

// writeSkeleton writes a manifest with the MISSING tools, valid against
// the registry schema, to path (created, never overwritten).
func writeSkeleton(path, serverID, serverVersion string, findings []lintFinding) error {
	m := schemas.Manifest{SchemaID: "talos.mcp.tool_registry", SchemaVersion: "v1", ServerID: serverID}
	if serverVersion != "" && len(serverVersion) <= 128 {
		m.ServerVersion = serverVersion
	}
	m.Tools = []schemas.Tool{}
	for _, f := range findings {
		if f.Kind == lintMissing {
			m.Tools = append(m.Tools, schemas.Tool{ToolName: f.Tool, ToolClass: f.Suggested, TrustLevel: enforce.TrustUnknown})
		}
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if _, err := schemas.ParseManifest(b); err != nil {
		return fmt.Errorf("the skeleton would not be a valid manifest: %w", err)
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
func printLint(w io.Writer, rep *lintReport, skeleton string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, f := range rep.Findings {
		action := "-"
		if f.Action != "" {
			action = printable(f.Action)
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\n", f.Kind, rep.ServerID, printable(f.Tool), action, f.Detail)
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
	_, err := fmt.Fprintf(w, "lint %s (%s): %d tools on the server, %d in the registry: %d missing, %d missing actions, %d stale, %d stale actions, %d without an action enum, %d advisories: %s\n",
		rep.ServerID, strings.TrimSpace(server), rep.LiveTools, rep.RegistryTools,
		n[lintMissing], n[lintMissingAction], n[lintStale], n[lintStaleAction], n[lintNoActionEnum], n[lintAdvisory], verdict)
	if err == nil && rep.Skeleton != "" {
		_, err = fmt.Fprintf(w, "wrote a skeleton with %d tools to %s: review tool_class and trust_level before publishing\n", n[lintMissing], rep.Skeleton)
	} else if err == nil && skeleton != "" {
		_, err = fmt.Fprintln(w, "nothing missing: no skeleton written")
	}
	return err
}

// printableList joins names a server chose, each made printable.
func printableList(ss []string) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = printable(s)
	}
	return strings.Join(out, ", ")
}

// printable quotes a name a server chose when it holds anything but
// printable ASCII (a hostile server must not write to the terminal).
func printable(s string) string {
	for _, r := range s {
		if r < 0x21 || r > 0x7e {
			return strconv.Quote(s)
		}
	}
	return s
}
