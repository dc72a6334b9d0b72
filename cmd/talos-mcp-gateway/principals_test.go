package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/testenv"
)

// bearer adds an Authorization header to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestToolsListPerPrincipal serves two principals over streamable HTTP:
// alice holds a capability for both servers, bob a read-only one for
// server-everything only. Their tools/list differ exactly as their
// capabilities do (CSP MUST 3), bob sees only the read-only actions
// of an action-based tool (CM-ACTIONS), and his call to a hidden action is
// refused by the gateway and, independently, by the worker.
func TestToolsListPerPrincipal(t *testing.T) {
	s := startStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := s.dir
	s.ctl("cap", "issue", "--issuer-key", filepath.Join(d, "issuer.key"), "--subject", "alice", "--subject-key", filepath.Join(d, "alice.pub"),
		"--scope", "tool:everything:*", "--scope", "tool:fs:*", "--out", filepath.Join(d, "alice.cap.json"))
	s.ctl("cap", "issue", "--issuer-key", filepath.Join(d, "issuer.key"), "--subject", "bob", "--subject-key", filepath.Join(d, "bob.pub"),
		"--scope", "tool:everything:*", "--read-only", "--out", filepath.Join(d, "bob.cap.json"))
	principals := map[string]any{"principals": []map[string]string{
		{"name": "alice", "token_sha256": sha("alice-token"), "capability": "alice.cap.json", "agent_key": "alice.key"},
		{"name": "bob", "token_sha256": sha("bob-token"), "capability": "bob.cap.json", "agent_key": "bob.key"},
	}}
	b, _ := json.Marshal(principals)
	if err := os.WriteFile(filepath.Join(d, "principals.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	port := testenv.FreePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	s.serveGateway(t, testenv.Command(s.gateway, append(upstreams(t, t.TempDir()), "--ep-id", "gw-http", "--nats-url", s.natsURL(), "--nats-auth", "none",
		"--registry", registryDir, "--listen", "127.0.0.1:"+strconv.Itoa(port), "--insecure-plain-http", "--principals", filepath.Join(d, "principals.json"))...),
		http.DefaultClient, base)
	resp, err := http.Post(base+"/mcp", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: HTTP %d, want 401", resp.StatusCode)
	}

	connect := func(token string) *gatewaySession {
		client := mcp.NewClient(&mcp.Implementation{Name: "talos-test-" + token, Version: "1"}, nil)
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp",
			HTTPClient: &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}}}, nil)
		if err != nil {
			t.Fatalf("connect as %s: %v", token, err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return &gatewaySession{cs: cs}
	}
	alice, bob := connect("alice-token"), connect("bob-token")
	list := func(g *gatewaySession) map[string]*mcp.Tool {
		res, err := g.cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]*mcp.Tool{}
		for _, tl := range res.Tools {
			m[tl.Name] = tl
		}
		return m
	}
	at, bt := list(alice), list(bob)
	for _, name := range []string{"echo", "write_file", "read_text_file", "toggle-simulated-logging", "get-annotated-message"} {
		if at[name] == nil {
			t.Errorf("alice should see %s", name)
		}
	}
	for _, name := range []string{"echo", "get-sum", "get-annotated-message"} {
		if bt[name] == nil {
			t.Errorf("bob should see %s", name)
		}
	}
	for _, name := range []string{"write_file", "read_text_file", "toggle-simulated-logging"} {
		if bt[name] != nil {
			t.Errorf("bob must not see %s (outside his scope, or a write tool under read_only)", name)
		}
	}
	if len(bt) >= len(at) {
		t.Fatalf("bob sees %d tools, alice %d", len(bt), len(at))
	}
	enumOf := func(tl *mcp.Tool) []string {
		vals, ok := mcpup.ActionEnum(tl.InputSchema, "/messageType")
		if !ok {
			t.Fatalf("%s: no action enum in %v", tl.Name, tl.InputSchema)
		}
		slices.Sort(vals)
		return vals
	}
	if got := enumOf(at["get-annotated-message"]); !slices.Equal(got, []string{"debug", "error", "success"}) {
		t.Fatalf("alice's actions: %v", got)
	}
	if got := enumOf(bt["get-annotated-message"]); !slices.Equal(got, []string{"debug", "success"}) {
		t.Fatalf("bob's actions: %v (want only the read-only ones)", got)
	}

	// bob's read-only action works; the hidden one is refused twice over.
	bob.call(ctx, "get-annotated-message", map[string]any{"messageType": "success"}).mustAllow(t, "bob, read-only action")
	den := bob.call(ctx, "get-annotated-message", map[string]any{"messageType": "error"}).mustDeny(t, "bob, hidden action",
		schemas.CodeToolHidden, schemas.CodeToolClassMismatch)
	alice.call(ctx, "get-annotated-message", map[string]any{"messageType": "error"}).mustAllow(t, "alice, the same action")
	bob.call(ctx, "write_file", map[string]any{"path": "/tmp/x", "content": "x"}).mustDeny(t, "bob, a tool he cannot see", schemas.CodeToolHidden)

	_, codes := waitDecision(ctx, t, s, "bob's hidden-action call", "tool_call_id = ?", den.ToolCallID)
	if !slices.Contains(codes, schemas.CodeToolClassMismatch) {
		t.Fatalf("the worker's receipt for the hidden action: %v, want %s (the worker refuses it too)", codes, schemas.CodeToolClassMismatch)
	}
}
