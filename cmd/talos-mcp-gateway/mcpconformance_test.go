package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// conformanceTools are the tools of testenv/mcp/conformance-server.mjs,
// all classified read in the test's registry.
var conformanceTools = []string{"test_simple_text", "test_image_content", "test_audio_content", "test_embedded_resource",
	"test_multiple_content_types", "test_tool_with_logging", "test_error_handling", "test_tool_with_progress", "test_sampling",
	"test_elicitation", "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums", "test_reconnection", "json_schema_2020_12_tool"}

// conformancePrompts and conformanceResources are the prompts and the
// resources (three URIs and a template) of conformance-server.mjs, which
// Talos decides like its tools.
var conformancePrompts = []string{"test_simple_prompt", "test_prompt_with_arguments", "test_prompt_with_embedded_resource", "test_prompt_with_image"}

const conformanceResources = `{"name": "static", "uri": "test://{name}", "trust_level": "verified"},
	{"name": "template", "uri": "test://template/{id}/data", "trust_level": "verified"}`

// scenarioLine is a line of the suite's summary: "✓ name: N passed, M failed".
var scenarioLine = regexp.MustCompile(`^\S+ ([a-z0-9-]+): (\d+) passed, (\d+) failed`)

// scenarioResult is one scenario's checks, and where the suite wrote
// their details.
type scenarioResult struct {
	passed, failed int
	dir            string
}

// runConformance runs the official MCP conformance suite's server scenarios
// (the active suite) against url and returns each scenario's counts.
func runConformance(ctx context.Context, t *testing.T, url string) map[string]scenarioResult {
	t.Helper()
	dir := t.TempDir()
	cmd := testenv.CommandContext(ctx, testenv.MCPBin(t, testenv.MCPConformance), "server", "--url", url, "--output-dir", dir)
	out, err := cmd.CombinedOutput()
	got := map[string]scenarioResult{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	summary := false
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "=== SUMMARY ===") {
			summary = true
		}
		if m := scenarioLine.FindStringSubmatch(line); summary && m != nil {
			p, _ := strconv.Atoi(m[2])
			f, _ := strconv.Atoi(m[3])
			got[m[1]] = scenarioResult{p, f, dir}
		}
	}
	if len(got) == 0 {
		t.Fatalf("the conformance suite against %s printed no summary (%v):\n%s", url, err, tail(string(out), 4000))
	}
	return got
}

// unpassedChecks is what the suite recorded in dir of scenario's checks
// that did not pass (status other than SUCCESS or INFO), one JSON object a
// line: which check, and why.
func unpassedChecks(t *testing.T, dir, scenario string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "server-"+scenario+"-*", "checks.json"))
	if len(files) != 1 {
		return fmt.Sprintf("(%d checks.json files for it in %s)", len(files), dir)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return err.Error()
	}
	var checks []map[string]any
	if err := json.Unmarshal(b, &checks); err != nil {
		return err.Error()
	}
	var lines []string
	for _, c := range checks {
		if c["status"] != "SUCCESS" && c["status"] != "INFO" {
			line, _ := json.Marshal(c)
			lines = append(lines, string(line))
		}
	}
	return strings.Join(lines, "\n")
}

// conformanceBaseline reads testenv/mcp/conformance-baseline.txt: the
// scenarios MCP itself keeps from passing through a gateway, each with
// its reason.
func conformanceBaseline(t *testing.T) map[string]string {
	t.Helper()
	_, dir := testenv.MCPScript(t, "conformance-server.mjs")
	b, err := os.ReadFile(filepath.Join(dir, "conformance-baseline.txt"))
	if err != nil {
		t.Fatal(err)
	}
	base := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, reason, _ := strings.Cut(line, " ")
		if strings.TrimSpace(reason) == "" {
			t.Fatalf("conformance-baseline.txt: %s has no reason beside it", name)
		}
		base[name] = strings.TrimSpace(reason)
	}
	return base
}

// bearerProxy is a local reverse proxy to target that adds the bearer
// token to each request that has none (the suite sends none) and passes
// everything else, the Host header included, unchanged.
func bearerProxy(t *testing.T, target, token string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = r.In.Host
			if r.Out.Header.Get("Authorization") == "" {
				r.Out.Header.Set("Authorization", "Bearer "+token)
			}
		},
		FlushInterval: -1, // SSE streams go through as they are written
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
}

// TestMCPConformanceThroughGateway (issue 21): the official MCP
// conformance suite's server scenarios, run against the reference server
// directly and through talos-mcp-gateway's HTTP mode (a test principal;
// a proxy adds its token), pass the same checks: every check passes
// directly, and every scenario passes through with as many checks, except
// the ones the baseline file lists with the reason MCP keeps them from
// passing through. A scenario the baseline lists that passes through
// fails the test, so the baseline cannot go stale. Every tools/call,
// prompts/get and resources/read of the run was decided by Talos, and
// its server's sampling and elicitation requests recorded: ClickHouse
// holds an allow receipt for each tool, prompt and resource (by its
// registry name) the suite uses, and for each kind of server request.
func TestMCPConformanceThroughGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	upstream := testenv.StartConformanceServer(t)
	direct := runConformance(ctx, t, upstream)
	total := 0
	for name, r := range direct {
		if r.failed != 0 {
			t.Fatalf("directly, scenario %s failed %d checks: the reference server does not pass its own suite", name, r.failed)
		}
		total += r.passed
	}
	if total != 40 {
		t.Fatalf("directly, %d checks passed, want the 40 of the pinned suite: %v", total, direct)
	}

	reg := t.TempDir()
	var entries []string
	for _, tool := range conformanceTools {
		entries = append(entries, fmt.Sprintf(`{"tool_name": %q, "tool_class": "read", "is_document_op": false, "trust_level": "verified"}`, tool))
	}
	var prompts []string
	for _, p := range conformancePrompts {
		prompts = append(prompts, fmt.Sprintf(`{"name": %q, "trust_level": "verified"}`, p))
	}
	manifest := `{"schema_id": "talos.mcp.tool_registry", "schema_version": "v1", "server_id": "conf", "tools": [` + strings.Join(entries, ",") +
		`], "prompts": [` + strings.Join(prompts, ",") + `], "resources": [` + conformanceResources + `]}`
	if err := os.WriteFile(filepath.Join(reg, "conf.json"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startStackRegistry(t, reg)
	writeJSON(t, filepath.Join(s.dir, "principals.json"), map[string]any{"principals": []map[string]string{
		{"name": "suite", "token_sha256": sha("suite-token"), "agent_id": "conformance-suite"}}})
	port := testenv.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	s.httpGateway(t, base, "--ep-id", "gw-conf", "--upstream", "conf="+upstream, "--registry", reg, "--relay-ungoverned",
		"--listen", "127.0.0.1:"+strconv.Itoa(port), "--insecure-plain-http", "--principals", filepath.Join(s.dir, "principals.json"))
	through := runConformance(ctx, t, bearerProxy(t, base, "suite-token")+"/mcp")

	baseline := conformanceBaseline(t)
	var failures []string
	for _, name := range sortedNames(direct) {
		d, g := direct[name], through[name]
		reason, listed := baseline[name]
		same := g.passed == d.passed && g.failed == d.failed
		switch {
		case !same && !listed:
			failures = append(failures, fmt.Sprintf("%s: %d passed, %d failed through the gateway; %d passed directly", name, g.passed, g.failed, d.passed))
			t.Logf("%s through the gateway, its checks that did not pass:\n%s", name, unpassedChecks(t, g.dir, name))
		case same && listed:
			failures = append(failures, fmt.Sprintf("%s passes through the gateway but the baseline lists it (%s): take it out", name, reason))
		}
	}
	if len(failures) > 0 {
		t.Fatalf("the conformance suite through the gateway differs from directly:\n%s", strings.Join(failures, "\n"))
	}
	for _, tool := range []string{"test_simple_text", "test_sampling", "test_elicitation", "test_tool_with_progress", "test_simple_prompt", "static", "template",
		schemas.MethodSamplingCreateMessage, schemas.MethodElicitationCreate} {
		decision, _ := waitDecision(ctx, t, s, "the suite's call of "+tool, "server_id = 'conf' AND tool_name = ?", tool)
		if decision != "allow" {
			t.Fatalf("the suite's call of %s was %s, want allow", tool, decision)
		}
	}
}

// httpGateway starts the gateway binary in HTTP mode (args) and waits for
// base/healthz to answer 200.
func (s *stack) httpGateway(t *testing.T, base string, args ...string) {
	t.Helper()
	s.serveGateway(t, testenv.Command(s.gateway, append([]string{"--nats-url", s.natsURL(), "--nats-auth", "none",
		"--trusted-keys", filepath.Join(s.dir, "worker.pub")}, args...)...), http.DefaultClient, base)
}

func sortedNames(m map[string]scenarioResult) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
