package mcpup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/testenv"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func toolNames(tools []*mcp.Tool) []string {
	var names []string
	for _, t := range tools {
		names = append(names, t.Name)
	}
	sort.Strings(names)
	return names
}

// TestConnectHTTPListsEveryPage: a real SDK server over streamable HTTP
// with two tools a page; ListTools follows the cursors to all seven.
func TestConnectHTTPListsEveryPage(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "paged", Version: "1.0.0"}, &mcp.ServerOptions{PageSize: 2})
	var want []string
	for i := range 7 {
		name := fmt.Sprintf("tool-%d", i)
		want = append(want, name)
		srv.AddTool(&mcp.Tool{Name: name, InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{}, nil
			})
	}
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	defer hs.Close()

	spec, err := ParseSpec("paged=" + hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	cs, err := Connect(ctx, spec, &mcp.Implementation{Name: "talos-test", Version: "0"})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	defer cs.Close()
	if got := cs.InitializeResult().ServerInfo.Name; got != "paged" {
		t.Fatalf("server name %q", got)
	}
	tools, err := ListTools(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	if got := toolNames(tools); !slices.Equal(got, want) {
		t.Fatalf("tools %q, want %q", got, want)
	}
	tools, info, err := ListServer(ctx, spec, &mcp.Implementation{Name: "talos-test", Version: "0"})
	if err != nil || info == nil || info.Name != "paged" || info.Version != "1.0.0" || !slices.Equal(toolNames(tools), want) {
		t.Fatalf("ListServer: %q %+v %v", toolNames(tools), info, err)
	}
}

func TestConnectHTTPUnreachable(t *testing.T) {
	hs := httptest.NewServer(http.NotFoundHandler())
	url := hs.URL
	hs.Close() // nothing listens there now
	spec, err := ParseSpec("gone=" + strings.Replace(url, "http://", "http://user:s3cret@", 1) + "/mcp?token=s3cret")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Connect(testCtx(t), spec, nil)
	if err == nil {
		t.Fatal("Connect to a closed port succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, `server "gone"`) || !strings.Contains(msg, "streamable HTTP") || strings.Contains(msg, "s3cret") {
		t.Fatalf("error %q: want the server_id and the transport, never the credentials", msg)
	}
}

func TestConnectStdioFailures(t *testing.T) {
	ctx := testCtx(t)
	_, err := Connect(ctx, Spec{ServerID: "nope", Command: []string{"talos-no-such-program-xyz", "--token", "s3cret"}}, nil)
	if !errors.Is(err, ErrStart) || !strings.Contains(err.Error(), `server "nope"`) || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("missing program: %v; want ErrStart naming the server, without the arguments", err)
	}

	var stderr testenv.SyncBuffer
	_, err = Connect(ctx, Spec{ServerID: "dies", Command: []string{"sh", "-c", "echo boom >&2; exit 3"}}, nil, WithStderr(&stderr))
	if err == nil || errors.Is(err, ErrStart) {
		t.Fatalf("process that exits: %v; want a handshake error, not ErrStart", err)
	}
	if msg := err.Error(); !strings.Contains(msg, `server "dies"`) || !strings.Contains(msg, "exited with status 3") {
		t.Fatalf("error %q: want the server_id and the exit status", msg)
	}
	if !strings.Contains(stderr.String(), "boom") {
		t.Fatalf("the child's stderr did not reach WithStderr's writer: %q", stderr.String())
	}

	if _, err := Connect(ctx, Spec{ServerID: "empty"}, nil); err == nil {
		t.Fatal("Connect with neither URL nor command succeeded")
	}
}

// TestConnectStdioEverything: the npm reference server over stdio, with an
// environment variable passed through Spec.Env and read back by its get-env
// tool.
func TestConnectStdioEverything(t *testing.T) {
	bin := testenv.MCPBin(t, testenv.MCPServerEverything)
	ctx := testCtx(t)
	var stderr testenv.SyncBuffer
	cs, err := Connect(ctx, Spec{ServerID: "everything", Command: []string{bin}, Env: []string{"TALOS_MCPUP_PROBE=probe-value"}},
		&mcp.Implementation{Name: "talos-test", Version: "0"}, WithStderr(&stderr), WithTerminateWait(500*time.Millisecond))
	if err != nil {
		t.Fatalf("Connect: %v\nstderr: %s", err, stderr.String())
	}
	defer cs.Close()
	tools, err := ListTools(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	names := toolNames(tools)
	for _, want := range []string{"echo", "get-annotated-message", "get-env", "get-sum"} {
		if !slices.Contains(names, want) {
			t.Fatalf("tools %q lack %q", names, want)
		}
	}
	var annotated *mcp.Tool
	for _, tl := range tools {
		if tl.Name == "get-annotated-message" {
			annotated = tl
		}
	}
	got, ok := ActionEnum(annotated.InputSchema, "/messageType")
	if !ok || !slices.Equal(sortedStrings(got), []string{"debug", "error", "success"}) {
		t.Fatalf("messageType enum = %q, %v", got, ok)
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get-env"})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if !strings.Contains(text.String(), "probe-value") {
		t.Fatalf("get-env does not show Spec.Env's variable: %.300s", text.String())
	}
}

func sortedStrings(ss []string) []string {
	out := slices.Clone(ss)
	slices.Sort(out)
	return out
}

// TestConnectStdioWrap: Spec.Wrap decides the command and the whole
// environment of a stdio server (the gateway's sandbox); a Wrap error is
// ErrStart and nothing runs.
func TestConnectStdioWrap(t *testing.T) {
	bin := testenv.MCPBin(t, testenv.MCPServerEverything)
	ctx := testCtx(t)
	t.Setenv("TALOS_MCPUP_HOST_ONLY", "host-value")
	var gotArgv, gotEnv []string
	wrap := func(argv, env []string) ([]string, []string, error) {
		gotArgv, gotEnv = argv, env
		return append([]string{"/usr/bin/env"}, argv...), append([]string{"PATH=" + os.Getenv("PATH")}, env...), nil
	}
	cs, err := Connect(ctx, Spec{ServerID: "everything", Command: []string{bin}, Env: []string{"TALOS_MCPUP_PROBE=wrapped"}, Wrap: wrap},
		nil, WithStderr(io.Discard), WithTerminateWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if !slices.Equal(gotArgv, []string{bin}) || !slices.Equal(gotEnv, []string{"TALOS_MCPUP_PROBE=wrapped"}) {
		t.Fatalf("Wrap got argv %q env %q", gotArgv, gotEnv)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get-env"})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if !strings.Contains(text.String(), "wrapped") || strings.Contains(text.String(), "host-value") {
		t.Fatalf("get-env under Wrap: %.300s", text.String())
	}

	_, err = Connect(ctx, Spec{ServerID: "refused", Command: []string{bin}, Wrap: func(argv, env []string) ([]string, []string, error) {
		return nil, nil, errors.New("no sandbox today")
	}}, nil)
	if !errors.Is(err, ErrStart) || !strings.Contains(err.Error(), "no sandbox today") {
		t.Fatalf("Wrap error: %v; want ErrStart with the cause", err)
	}
}
