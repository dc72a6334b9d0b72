package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// MCP servers and tools that MCPBin knows (npm packages pinned in
// testenv/mcp/package-lock.json).
const (
	MCPServerEverything = "mcp-server-everything" // @modelcontextprotocol/server-everything
	MCPServerFilesystem = "mcp-server-filesystem" // @modelcontextprotocol/server-filesystem <allowed dir>...
	MCPInspector        = "mcp-inspector"         // @modelcontextprotocol/inspector (use --cli)
	MCPConformance      = "conformance"           // @modelcontextprotocol/conformance (the official MCP conformance suite)
	MCPServerFetch      = "mcp-fetch-server"      // mcp-fetch-server: fetches URLs with Node's fetch(); undici beside it for the sandbox's Node preload
)

// MCPBin returns the absolute path of testenv/mcp/node_modules/.bin/<name>,
// the npm-installed MCP servers and the MCP Inspector that integration tests
// run as real upstreams. scripts/test.sh installs them (npm ci); when they
// or node are missing the test fails with that hint rather than skipping,
// so a CI run cannot pass without exercising them.
func MCPBin(t testing.TB, name string) string {
	t.Helper()
	dir, err := mcpDir()
	if err != nil {
		t.Fatalf("testenv: cannot find testenv/mcp (%v): run the tests from this repository", err)
	}
	p := filepath.Join(dir, "node_modules", ".bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("testenv: %s is not installed (%v): run scripts/test.sh (it installs the npm MCP servers)", name, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("testenv: node is not on PATH (%s needs it): run scripts/test.sh (it installs Node.js and the npm MCP servers)", name)
	}
	return p
}

// mcpDir is testenv/mcp of this repository.
func mcpDir() (string, error) { return sourceDir("mcp") }

// sourceDir is testenv/<name> of this repository: found from this file's
// own location, or from `go env GOMOD` when the build trimmed paths.
func sourceDir(name string) (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		d := filepath.Join(filepath.Dir(file), name)
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d, nil
		}
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", os.ErrNotExist
	}
	d := filepath.Join(filepath.Dir(gomod), "testenv", name)
	if _, err := os.Stat(d); err != nil {
		return "", err
	}
	return d, nil
}

// MCPScript returns the absolute path of testenv/mcp/<name>, a small MCP
// server written for the tests (run it with node; netprobe.mjs: a `connect`
// tool that tries direct and proxied egress; rugpull.mjs: a tool whose
// definition changes when `rug` is called), and the directory holding it.
func MCPScript(t testing.TB, name string) (path, dir string) {
	t.Helper()
	dir, err := mcpDir()
	if err != nil {
		t.Fatalf("testenv: cannot find testenv/mcp (%v): run the tests from this repository", err)
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("testenv: node is not on PATH (%s needs it): run scripts/test.sh (it installs Node.js)", name)
	}
	return p, dir
}
