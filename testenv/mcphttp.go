package testenv

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartEverythingHTTP runs the npm mcp-server-everything over streamable
// HTTP on a free loopback port until the test ends, and returns its base
// URL (http://127.0.0.1:<port>; the MCP endpoint is /mcp) once it says it
// listens, within 60 s.
func StartEverythingHTTP(t testing.TB) string {
	t.Helper()
	port := strconv.Itoa(FreePort(t))
	srv := exec.Command(MCPBin(t, MCPServerEverything), "streamableHttp")
	srv.Env = append(os.Environ(), "PORT="+port)
	stderr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	drained := make(chan struct{})
	t.Cleanup(func() { _ = srv.Process.Kill(); <-drained; _ = srv.Wait() })
	ready := make(chan bool, 1)
	go func() { // owned by the cleanup above, which waits for drained
		defer close(drained)
		sc := bufio.NewScanner(stderr)
		said := false
		for sc.Scan() {
			if !said && strings.Contains(sc.Text(), "listening on port "+port) {
				said = true
				ready <- true
			}
		}
		if !said {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("mcp-server-everything streamableHttp exited before listening")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("mcp-server-everything streamableHttp is not listening after 60s")
	}
	return "http://127.0.0.1:" + port
}

// StartConformanceServer runs testenv/mcp/conformance-server.mjs, the
// streamable HTTP server the official MCP conformance suite tests, on a
// free loopback port until the test ends, and returns its MCP endpoint
// (http://localhost:<port>/mcp: the suite's DNS-rebinding scenario needs a
// localhost name).
func StartConformanceServer(t testing.TB) string {
	t.Helper()
	script, dir := MCPScript(t, "conformance-server.mjs")
	srv := exec.Command("node", script)
	srv.Dir = dir
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	drained := make(chan struct{})
	t.Cleanup(func() { _ = srv.Process.Kill(); <-drained; _ = srv.Wait() })
	url := make(chan string, 1)
	go func() { // owned by the cleanup above, which waits for drained
		defer close(drained)
		sc := bufio.NewScanner(stdout)
		said := false
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening "); ok && !said {
				said = true
				url <- u
			}
		}
		if !said {
			url <- ""
		}
	}()
	select {
	case u := <-url:
		if u == "" {
			t.Fatal("conformance-server.mjs exited before listening")
		}
		return u
	case <-time.After(60 * time.Second):
		t.Fatal("conformance-server.mjs is not listening after 60s")
	}
	return ""
}
