// Package registrylint is the completeness test of CM-COMPLETE: it compares
// a server's tool registry manifest with the tools that server lists over
// MCP, and names what the registry does not classify (MISSING, a call to it
// is denied in prod), what it classifies that the server no longer offers
// (STALE), for action-based tools the actions on either side only, and
// pinned tools whose live definition is not the pinned one (DRIFT, OWASP
// MCP03), and likewise the server's prompts, resources and resource
// templates (governed.go: MISSING_PROMPT, MISSING_RESOURCE, STALE_*);
// WritePins pins the live definitions. It talks to no server: the caller
// lists the tools (and Features) and passes them in; report.go reads the
// registry, writes the skeleton file and renders the report.
package registrylint

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/schemas"
)

// Kinds of findings. MISSING and MISSING_ACTION fail the lint; STALE,
// STALE_ACTION and NO_ACTION_ENUM are warnings; ADVISORY compares the
// upstream's self-reported annotations, which Talos never trusts, with the
// registry, and never fails.
const (
	Missing       = "MISSING"
	MissingAction = "MISSING_ACTION"
	Stale         = "STALE"
	StaleAction   = "STALE_ACTION"
	NoActionEnum  = "NO_ACTION_ENUM"
	Advisory      = "ADVISORY"
	// Drift: a tool's live definition is not the one its definition_sha256
	// pins (a call to it is denied DENY_TOOL_DRIFT).
	Drift = "DRIFT"
	// Invalid: the server lists a tool whose definition cannot be served
	// (malformed, or an input schema MCP clients cannot use); the gateway
	// hides it and serves the rest.
	Invalid = "INVALID"
)

// Severities of findings.
const (
	SeverityError    = "error"
	SeverityWarning  = "warning"
	SeverityAdvisory = "advisory"
)

// kinds orders findings and gives each kind's severity.
var kinds = []struct{ kind, severity string }{
	{Missing, SeverityError},
	{MissingAction, SeverityError},
	{Drift, SeverityError},
	{Invalid, SeverityWarning},
	{Stale, SeverityWarning},
	{StaleAction, SeverityWarning},
	{NoActionEnum, SeverityWarning},
	{MissingPrompt, SeverityError},
	{MissingResource, SeverityError},
	{StalePrompt, SeverityWarning},
	{StaleResource, SeverityWarning},
	{Advisory, SeverityAdvisory},
}

// Severity is kind's severity (an unknown kind is an error).
func Severity(kind string) string {
	for _, k := range kinds {
		if k.kind == kind {
			return k.severity
		}
	}
	return SeverityError
}

// Finding is one line of the report.
type Finding struct {
	Kind     string `json:"kind"`
	Severity string `json:"severity"` // error | warning | advisory
	Tool     string `json:"tool"`
	Action   string `json:"action,omitempty"`
	Detail   string `json:"detail"`
	// Suggested is MISSING's suggested tool_class (from readOnlyHint).
	Suggested string `json:"suggested_tool_class,omitempty"`
	// URI is a resource finding's URI or URI template (Tool is then the
	// resource's name).
	URI string `json:"uri,omitempty"`
}

// Report is a whole lint: what was compared, the findings and their
// counts. It is what talosctl registry lint --json prints.
type Report struct {
	ServerID       string         `json:"server_id"`
	Server         string         `json:"server"` // the spec without secrets
	ServerName     string         `json:"server_name,omitempty"`
	ServerVersion  string         `json:"server_version,omitempty"`
	Registry       string         `json:"registry,omitempty"`
	RegistryDigest string         `json:"registry_digest,omitempty"`
	ManifestFound  bool           `json:"manifest_found"`
	LiveTools      int            `json:"live_tools"`
	RegistryTools  int            `json:"registry_tools"`
	Findings       []Finding      `json:"findings"`
	Counts         map[string]int `json:"counts"`
	OK             bool           `json:"ok"`
	Skeleton       string         `json:"skeleton,omitempty"`
	// PinsFile is the manifest file --write-pins rewrote, and PinsWritten
	// how many pins it changed.
	PinsFile    string `json:"pins_file,omitempty"`
	PinsWritten int    `json:"pins_written,omitempty"`
	// LivePrompts and LiveResources count the prompts and the resources
	// and templates the server lists, RegistryPrompts and
	// RegistryResources the manifest's (when Features was called).
	LivePrompts       int `json:"live_prompts"`
	LiveResources     int `json:"live_resources"`
	RegistryPrompts   int `json:"registry_prompts"`
	RegistryResources int `json:"registry_resources"`
	// invalid holds the tools the server listed that cannot be served,
	// with why (Reject).
	invalid map[string]string
	// features is what the server lists besides tools (Features).
	features *features
}

// Reject notes a definition the server listed that cannot be served
// (kind "tool"; other kinds are not linted): Lint reports it INVALID, and
// not STALE when the registry has it.
func (rep *Report) Reject(kind, name, why string) {
	if kind != "tool" {
		return
	}
	if rep.invalid == nil {
		rep.invalid = map[string]string{}
	}
	rep.invalid[name] = why
}

// ActionEnumFunc returns the values a tool's input schema allows at an
// action pointer (ok false when it has no enum or const there).
type ActionEnumFunc func(inputSchema any, actionPointer string) (values []string, ok bool)

// Lint compares manifest m with the tools a server lists and fills rep's
// sizes, findings, counts (every kind present, zero or not) and verdict:
// OK when no finding is an error.
func Lint(rep *Report, m *schemas.Manifest, live []*mcp.Tool, enum ActionEnumFunc) {
	rep.LiveTools, rep.RegistryTools = len(live), len(m.Tools)
	rep.Findings = slices.DeleteFunc(Compare(m, live, enum), func(f Finding) bool {
		_, bad := rep.invalid[f.Tool]
		return bad && f.Kind == Stale
	})
	if f := rep.features; f != nil {
		rep.LivePrompts, rep.LiveResources = len(f.prompts), len(f.resources)+len(f.templates)
		rep.RegistryPrompts, rep.RegistryResources = len(m.Prompts), len(m.Resources)
		rep.Findings = append(rep.Findings, compareFeatures(m, f)...)
	}
	for _, name := range slices.Sorted(maps.Keys(rep.invalid)) {
		rep.Findings = append(rep.Findings, Finding{Kind: Invalid, Severity: Severity(Invalid), Tool: name,
			Detail: "listed by the server but cannot be served (" + rep.invalid[name] + "): the gateway hides it"})
	}
	sortFindings(rep.Findings)
	rep.Counts = map[string]int{}
	for _, k := range kinds {
		rep.Counts[k.kind] = 0
	}
	errs := 0
	for _, f := range rep.Findings {
		rep.Counts[f.Kind]++
		if f.Severity == SeverityError {
			errs++
		}
	}
	rep.OK = errs == 0
}

// Compare is the comparison itself: live tools absent from m (MISSING), m's
// tools absent from the server (STALE), and for m's action-based tools the
// live action enum at action_pointer against m's actions (MISSING_ACTION,
// STALE_ACTION, NO_ACTION_ENUM), plus ADVISORY mismatches between the
// upstream's annotations and m's classification. Findings are ordered by
// kind (MISSING first, ADVISORY last), then tool, then action.
func Compare(m *schemas.Manifest, live []*mcp.Tool, enum ActionEnumFunc) []Finding {
	out := []Finding{}
	add := func(kind, tool, action, detail string) {
		out = append(out, Finding{Kind: kind, Severity: Severity(kind), Tool: tool, Action: action, Detail: detail})
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
			add(Missing, lt.Name, "", "on the server, not in the registry: unclassified, prod denies its calls ("+hintSummary(lt.Annotations)+"; suggest tool_class "+class+")")
			out[len(out)-1].Suggested = class
			continue
		}
		lintPin(rt, lt, add)
		lintActions(rt, lt, enum, add)
		lintAnnotations(rt, lt, add)
	}
	for i := range m.Tools {
		if name := m.Tools[i].ToolName; !onServer[name] {
			add(Stale, name, "", "in the registry, not on the server (renamed, removed, or hidden from this client)")
		}
	}
	sortFindings(out)
	return out
}

// sortFindings orders findings by kind, then tool, then action.
func sortFindings(out []Finding) {
	order := map[string]int{}
	for i, k := range kinds {
		order[k.kind] = i
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		if d := order[a.Kind] - order[b.Kind]; d != 0 {
			return d
		}
		if d := strings.Compare(a.Tool, b.Tool); d != 0 {
			return d
		}
		return strings.Compare(a.Action, b.Action)
	})
}

// Definition is the part of a listed tool that its definition pin covers.
func Definition(t *mcp.Tool) enforce.ToolDefinition {
	d := enforce.ToolDefinition{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema}
	if t.Annotations != nil {
		d.Annotations = t.Annotations
	}
	return d
}

// lintPin reports a pinned tool whose live definition is another.
func lintPin(rt *schemas.Tool, lt *mcp.Tool, add func(kind, tool, action, detail string)) {
	if rt.DefinitionSHA256 == "" {
		return
	}
	live, err := Definition(lt).SHA256()
	if err != nil {
		add(Drift, lt.Name, "", "the live definition cannot be hashed: "+err.Error())
		return
	}
	if drift, why := enforce.DefinitionDrift(rt, live); drift {
		add(Drift, lt.Name, "", why+": the server changed the tool since it was pinned; calls are denied DENY_TOOL_DRIFT (review it, then --write-pins)")
	}
}

// WritePins returns manifest (a manifest's JSON, for serverID) with the
// definition_sha256 of every tool the server lists set to its live
// definition, indented, and how many pins changed. Tools the server does not
// list keep what they had. The result is checked against the registry
// schema.
func WritePins(manifest []byte, live []*mcp.Tool) ([]byte, int, error) {
	m, err := schemas.ParseManifest(manifest)
	if err != nil {
		return nil, 0, err
	}
	hashes := map[string]string{}
	for _, lt := range live {
		if lt == nil {
			continue
		}
		h, err := Definition(lt).SHA256()
		if err != nil {
			return nil, 0, fmt.Errorf("tool %s: %w", Printable(lt.Name), err)
		}
		hashes[lt.Name] = h
	}
	changed := 0
	for i := range m.Tools {
		if h, ok := hashes[m.Tools[i].ToolName]; ok && m.Tools[i].DefinitionSHA256 != h {
			m.Tools[i].DefinitionSHA256 = h
			changed++
		}
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, 0, err
	}
	b = append(b, '\n')
	if _, err := schemas.ParseManifest(b); err != nil {
		return nil, 0, fmt.Errorf("the pinned manifest would not be valid: %w", err)
	}
	return b, changed, nil
}

// lintActions checks an action-based registry tool against the live enum.
func lintActions(rt *schemas.Tool, lt *mcp.Tool, enum ActionEnumFunc, add func(kind, tool, action, detail string)) {
	if rt.ActionPointer == "" {
		// Not declared action-based: point out an obvious action enum.
		if vals, ok := enum(lt.InputSchema, "/action"); ok {
			add(Advisory, lt.Name, "", fmt.Sprintf("the live schema has an enum of %d values at /action (%s) but the registry declares no action_pointer: every call gets tool_class %s", len(vals), printableList(vals), rt.ToolClass))
		}
		return
	}
	vals, ok := enum(lt.InputSchema, rt.ActionPointer)
	if !ok {
		add(NoActionEnum, lt.Name, "", "the live schema has no enum or const at action_pointer "+rt.ActionPointer+": the registry's actions cannot be checked (calls naming another action are unclassified)")
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
			add(MissingAction, lt.Name, v, "in the live enum at "+rt.ActionPointer+", not in the registry's actions: calls with it are unclassified")
		}
	}
	for _, a := range rt.Actions {
		if !inEnum[a.Name] {
			add(StaleAction, lt.Name, a.Name, "in the registry's actions, not in the live enum at "+rt.ActionPointer)
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
			add(Advisory, lt.Name, "", "upstream readOnlyHint=true, but the registry classes these actions as writes (stricter than the server claims): "+strings.Join(writes, ", "))
		case !a.ReadOnlyHint && len(writes) == 0:
			add(Advisory, lt.Name, "", "upstream does not claim read-only ("+hintSummary(a)+"), but the registry classifies every action as read-only")
		}
	} else {
		switch {
		case a.ReadOnlyHint && rt.ToolClass == schemas.ClassWrite:
			add(Advisory, lt.Name, "", "upstream readOnlyHint=true, registry tool_class write (stricter than the server claims)")
		case !a.ReadOnlyHint && rt.ToolClass == schemas.ClassRead:
			add(Advisory, lt.Name, "", "upstream does not claim read-only ("+hintSummary(a)+"), registry tool_class read")
		}
	}
	if a.OpenWorldHint != nil && rt.NetworkOutbound != nil && *a.OpenWorldHint != *rt.NetworkOutbound {
		add(Advisory, lt.Name, "", fmt.Sprintf("upstream openWorldHint=%t, registry network_outbound %t", *a.OpenWorldHint, *rt.NetworkOutbound))
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

// Skeleton is a manifest with the MISSING tools, prompts and resources of
// findings, as indented JSON, valid against the registry schema:
// tool_class as suggested, trust_level unknown. It is for a person to
// review before publishing.
func Skeleton(serverID, serverVersion string, findings []Finding) ([]byte, error) {
	m := schemas.Manifest{SchemaID: "talos.mcp.tool_registry", SchemaVersion: "v1", ServerID: serverID}
	if serverVersion != "" && len(serverVersion) <= 128 {
		m.ServerVersion = serverVersion
	}
	m.Tools = []schemas.Tool{}
	for _, f := range findings {
		if f.Kind == Missing {
			m.Tools = append(m.Tools, schemas.Tool{ToolName: f.Tool, ToolClass: f.Suggested, TrustLevel: enforce.TrustUnknown})
		}
	}
	skeletonFeatures(&m, findings)
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	b = append(b, '\n')
	if _, err := schemas.ParseManifest(b); err != nil {
		return nil, fmt.Errorf("the skeleton would not be a valid manifest: %w", err)
	}
	return b, nil
}

// printableList joins names a server chose, each made printable.
func printableList(ss []string) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = Printable(s)
	}
	return strings.Join(out, ", ")
}

// Printable quotes a name a server chose when it holds anything but
// printable ASCII (a hostile server must not write to the terminal).
func Printable(s string) string {
	for _, r := range s {
		if r < 0x21 || r > 0x7e {
			return strconv.Quote(s)
		}
	}
	return s
}
