package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/talos-audit/talos/testenv"
)

// relayRegistry is the registry of server-everything with the tools it
// offers only to clients that can sample and elicit classified too.
func relayRegistry(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(registryDir, "everything.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"trigger-sampling-request", "trigger-elicitation-request"} {
		m["tools"] = append(m["tools"].([]any), map[string]any{"tool_name": name, "tool_class": "read",
			"is_document_op": false, "trust_level": "verified", "risk_category": "LOW"})
	}
	dir := t.TempDir()
	writeJSON(t, filepath.Join(dir, "everything.json"), m)
	return dir
}

// relayClient is the test's MCP client: it answers sampling and
// elicitation itself and records what reaches it.
type relayClient struct {
	mu       sync.Mutex
	sampled  []string // the text of each sampling request's messages
	elicited []string // the message of each elicitation request
	progress []float64
	tokens   []any
	logs     []string
	updated  []string
}

func (c *relayClient) options() *mcp.ClientOptions {
	return &mcp.ClientOptions{
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			var b strings.Builder
			for _, m := range req.Params.Messages {
				if tc, ok := m.Content.(*mcp.TextContent); ok {
					b.WriteString(tc.Text)
				}
			}
			c.mu.Lock()
			c.sampled = append(c.sampled, b.String())
			c.mu.Unlock()
			return &mcp.CreateMessageResult{Model: "client-model", Role: "assistant", Content: &mcp.TextContent{Text: "sampled by the client"}}, nil
		},
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			c.mu.Lock()
			c.elicited = append(c.elicited, req.Params.Message)
			c.mu.Unlock()
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "Ada Lovelace"}}, nil
		},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, req.Params.Progress)
			c.tokens = append(c.tokens, req.Params.ProgressToken)
			c.mu.Unlock()
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			b, _ := json.Marshal(req.Params.Data)
			c.mu.Lock()
			c.logs = append(c.logs, string(req.Params.Level)+": "+string(b))
			c.mu.Unlock()
		},
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			c.mu.Lock()
			c.updated = append(c.updated, req.Params.URI)
			c.mu.Unlock()
		},
	}
}

// waitFor polls cond (under c.mu) for up to 30 s.
func (c *relayClient) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.mu.Lock()
		ok := cond()
		c.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRelayWholeProtocol (issue 21): behind the gateway in stdio mode,
// the real server-everything's prompts, resources, templates and
// completions reach the client as the server lists and answers them; the
// client's logging level reaches the server and its log messages the
// client; a tools/call's progress arrives under the client's own token;
// the server's sampling and elicitation requests during a tool call reach
// the client, whose answers go back to the server; roots/list is asked of
// the client; a subscription brings resources/updated; and a cancelled
// call leaves the session working.
func TestRelayWholeProtocol(t *testing.T) {
	s := startStackRegistry(t, relayRegistry(t))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rc := &relayClient{}
	client := mcp.NewClient(&mcp.Implementation{Name: "relay-test", Version: "1"}, rc.options())
	client.AddRoots(&mcp.Root{URI: "file:///srv/relay-root", Name: "relay-root"})
	gw := s.gatewayClient(ctx, client, "--ep-id", "gw-relay", "--relay-ungoverned", "--upstream", "everything="+testenv.MCPBin(t, "mcp-server-everything"))
	cs := gw.cs

	relayPrompts(ctx, t, cs)
	relayResources(ctx, t, cs)

	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	gw.call(ctx, "toggle-simulated-logging", map[string]any{}).mustAllow(t, "toggle-simulated-logging")
	rc.waitFor(t, "a log message of the server", func() bool { return len(rc.logs) > 0 })

	params := &mcp.CallToolParams{Name: "trigger-long-running-operation", Arguments: map[string]any{"duration": 1, "steps": 3}}
	params.SetProgressToken("client-token-1")
	if _, err := cs.CallTool(ctx, params); err != nil {
		t.Fatal(err)
	}
	rc.waitFor(t, "three progress notifications", func() bool { return len(rc.progress) >= 3 })
	rc.mu.Lock()
	for _, tok := range rc.tokens {
		if tok != "client-token-1" {
			t.Fatalf("progress arrived under token %v, not the client's", tok)
		}
	}
	rc.mu.Unlock()

	res := gw.call(ctx, "trigger-sampling-request", map[string]any{"prompt": "relay me", "maxTokens": 10}).mustAllow(t, "sampling")
	if !strings.Contains(text(res), "sampled by the client") || !strings.Contains(text(res), "client-model") {
		t.Fatalf("the sampling result did not come from the client: %s", text(res))
	}
	rc.waitFor(t, "the sampling request", func() bool { return len(rc.sampled) == 1 && strings.Contains(rc.sampled[0], "relay me") })
	res = gw.call(ctx, "trigger-elicitation-request", map[string]any{}).mustAllow(t, "elicitation")
	if !strings.Contains(text(res), "Ada Lovelace") {
		t.Fatalf("the elicitation result did not come from the client: %s", text(res))
	}
	rc.waitFor(t, "the elicitation request", func() bool { return len(rc.elicited) == 1 })
	if res := gw.call(ctx, "get-roots-list", map[string]any{}).mustAllow(t, "get-roots-list"); !strings.Contains(text(res), "file:///srv/relay-root") {
		t.Fatalf("roots/list did not reach the client: %s", text(res))
	}

	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "demo://resource/static/document/architecture.md"}); err != nil {
		t.Fatal(err)
	}
	gw.call(ctx, "toggle-subscriber-updates", map[string]any{}).mustAllow(t, "toggle-subscriber-updates")
	rc.waitFor(t, "resources/updated", func() bool { return slices.Contains(rc.updated, "demo://resource/static/document/architecture.md") })

	cctx, stop := context.WithCancel(ctx)
	long := &mcp.CallToolParams{Name: "trigger-long-running-operation", Arguments: map[string]any{"duration": 60, "steps": 60}}
	long.SetProgressToken("client-token-2")
	done := make(chan error, 1)
	go func() { _, err := cs.CallTool(cctx, long); done <- err }()
	rc.waitFor(t, "progress of the long call", func() bool { return slices.Contains(rc.tokens, any("client-token-2")) })
	stop()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the cancelled call returned a result")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled call never returned")
	}
	if got := text(gw.call(ctx, "echo", map[string]any{"message": "still here"}).mustAllow(t, "echo after a cancel")); got != "Echo: still here" {
		t.Fatalf("echo: %q", got)
	}
}

// relayPrompts: the server's prompts are listed, got with arguments, and
// completed, through the gateway.
func relayPrompts(ctx context.Context, t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	var names []string
	for p, err := range cs.Prompts(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, p.Name)
	}
	for _, want := range []string{"simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"} {
		if !slices.Contains(names, want) {
			t.Fatalf("prompts/list lacks %s: %v", want, names)
		}
	}
	got, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "args-prompt", Arguments: map[string]string{"city": "Lisbon"}})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(got.Messages); !strings.Contains(string(b), "Lisbon") {
		t.Fatalf("prompts/get args-prompt: %s", b)
	}
	if _, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "no-such-prompt"}); err == nil {
		t.Fatal("prompts/get of an unknown prompt succeeded")
	}
	comp, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "completable-prompt"},
		Argument: mcp.CompleteParamsArgument{Name: "department", Value: "E"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(comp.Completion.Values, []string{"Engineering"}) {
		t.Fatalf("completion/complete: %v", comp.Completion.Values)
	}
}

// relayResources: the server's resources and templates are listed and
// read through the gateway.
func relayResources(ctx context.Context, t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	var uris []string
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, r.URI)
	}
	const doc = "demo://resource/static/document/architecture.md"
	if !slices.Contains(uris, doc) {
		t.Fatalf("resources/list lacks %s: %v", doc, uris)
	}
	read, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: doc})
	if err != nil {
		t.Fatal(err)
	}
	if len(read.Contents) != 1 || read.Contents[0].Text == "" {
		t.Fatalf("resources/read %s: %+v", doc, read.Contents)
	}
	var templates []string
	for rt, err := range cs.ResourceTemplates(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		templates = append(templates, rt.URITemplate)
	}
	if !slices.Contains(templates, "demo://resource/dynamic/text/{resourceId}") {
		t.Fatalf("resources/templates/list: %v", templates)
	}
	read, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "demo://resource/dynamic/text/7"})
	if err != nil {
		t.Fatal(err)
	}
	if len(read.Contents) != 1 || !strings.Contains(read.Contents[0].Text, "7") {
		t.Fatalf("resources/read of a templated resource: %+v", read.Contents)
	}
}
