package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
	"github.com/talos-audit/talos/testenv"
)

// plantToolCall redacts args with r (as the worker does), builds the
// ToolCallEvent of one call from the redacted payload and its findings,
// signs it and stores it through the sink.
func plantToolCall(t *testing.T, ctx context.Context, w *query.SinkWriter, r *redact.Redactor, key *receipts.PrivateKey,
	callID, agent string, at time.Time, args map[string]any) {
	t.Helper()
	redacted, findings, err := r.Redact(args, "/args")
	if err != nil {
		t.Fatal(err)
	}
	payload, err := jsonkit.MarshalCanonical(redacted)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(payload)
	hash := hex.EncodeToString(sum[:])
	ev := schemas.ToolCallEvent{
		Type: schemas.ToolCallEventKind, TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", ToolCallID: callID,
		ToolID: "github/create_issue", ToolVersion: "1.0.0", Transport: "mcp", SideEffect: schemas.SideEffectWrite,
		Idempotency: schemas.IdempotencyWithKey, IdempotencyKey: "k-" + callID, Actor: schemas.Actor{Kind: "agent", AgentID: agent},
		OK: true, ArgsRef: "sha256:" + hash, ArgsHash: hash,
		Timing:    schemas.EventTiming{StartedAt: at.Format(schemas.TimeFormat), EndedAt: at.Format(schemas.TimeFormat)},
		SessionID: "sess-1", EPID: "gw-1", ServerID: "github", ToolName: "create_issue", Phase: schemas.PhasePost,
		Decision: schemas.DecisionAllow, ReasonCodes: []string{}, ReceiptID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d70",
		Redactions: findings, Payloads: &schemas.Payloads{Args: jsonkit.Canonical(payload)},
	}
	s, err := receipts.SignEvent(key, receipts.Meta{Type: schemas.TypeToolCall, Source: "talos://enforce/w1", Subject: callID, Time: at}, &ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ctx, []schemas.AuditRecord{{Subject: schemas.ToolCallEventSubject("github"), Data: s.JSON, StreamSeq: uint64(at.UnixMilli())}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := query.ToolCallRowFromEvent(s.JSON); err != nil {
		t.Fatalf("planted event is rejected: %v", err)
	}
}

// runWithStdin runs bin with stdin and returns stdout+stderr and the exit code.
func runWithStdin(t *testing.T, stdin, bin string, args ...string) (string, int) {
	t.Helper()
	cmd := testenv.Command(bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("talosctl %v: %v", args, err)
	}
	return out.String(), 0
}

// `talosctl query secret-uses` finds the calls that used a planted token
// (redacted by the real redactor, with talosd's key file), by value, from
// standard input or by pseudonym, and never prints the token.
func TestQuerySecretUses(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	addr, db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := openClickHouse(t, ctx, addr, db)
	if err := query.Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	keyPath := filepath.Join(dir, "keys", "redaction.key")
	rkey, kid, err := redact.LoadOrCreateKey(keyPath, true)
	if err != nil {
		t.Fatal(err)
	}
	r, err := redact.New(redact.Config{Key: rkey, KeyID: kid})
	if err != nil {
		t.Fatal(err)
	}
	signKey, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}

	const token = "ghp_q8Zx3LmN5pR7tV9wY2aB4cD6eF8gH0jK1lM3"
	const other = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
	at := time.Date(2026, 6, 1, 12, 0, 0, 250e6, time.UTC)
	w := query.NewSinkWriter(conn, db)
	calls := []string{"0190f5b2-7c1e-7a3b-8d4e-000000000001", "0190f5b2-7c1e-7a3b-8d4e-000000000002", "0190f5b2-7c1e-7a3b-8d4e-000000000003"}
	plantToolCall(t, ctx, w, r, signKey, calls[0], "agent-a", at, map[string]any{"title": "bug", "token": token})
	plantToolCall(t, ctx, w, r, signKey, calls[1], "agent-b", at.Add(time.Minute),
		map[string]any{"headers": map[string]any{"authorization": "Bearer " + token}, "body": "see " + token})
	plantToolCall(t, ctx, w, r, signKey, calls[2], "agent-c", at.Add(2*time.Minute), map[string]any{"token": other})

	g := []string{"--clickhouse-addr", addr, "--clickhouse-database", db}
	q := append(append([]string{}, g...), "query", "secret-uses", "--redaction-key", keyPath)

	out, code := runWithStdin(t, "", talosctl, append(q, "--value", token)...)
	if code != 0 {
		t.Fatalf("secret-uses --value: exit %d\n%s", code, out)
	}
	t.Logf("talosctl query secret-uses --value …:\n%s", out)
	for _, want := range []string{calls[0], calls[1], "agent-a", "agent-b", "github", "create_issue", "/args/token", "2 call(s) used this secret"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, calls[2]) || strings.Contains(out, token) {
		t.Errorf("output names the other call or prints the token:\n%s", out)
	}

	// From standard input, as JSON.
	out, code = runWithStdin(t, token+"\n", talosctl, append(q, "--value", "-", "--json")...)
	if code != 0 {
		t.Fatalf("secret-uses --value - --json: exit %d\n%s", code, out)
	}
	var res struct {
		Pseudonym string
		Uses      []struct {
			Time       string `json:"time"`
			ToolCallID string `json:"tool_call_id"`
			AgentID    string `json:"agent_id"`
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	var got []string
	for _, u := range res.Uses {
		got = append(got, u.ToolCallID+" "+u.AgentID+" "+u.Time)
	}
	want := []string{calls[0] + " agent-a 2026-06-01T12:00:00.250Z", calls[1] + " agent-b 2026-06-01T12:01:00.250Z"}
	if !slices.Equal(got, want) || res.Pseudonym != r.Pseudonym(token) || strings.Contains(out, token) {
		t.Fatalf("--json uses %v (pseudonym %s), want %v\n%s", got, res.Pseudonym, want, out)
	}

	// By pseudonym, without the key; --limit.
	out, code = runWithStdin(t, "", talosctl, append(append([]string{}, g...), "query", "secret-uses", "--pseudonym", r.Pseudonym(other), "--json", "--limit", "1")...)
	if code != 0 || !strings.Contains(out, calls[2]) || strings.Contains(out, calls[0]) {
		t.Fatalf("--pseudonym: exit %d\n%s", code, out)
	}
	out, code = runWithStdin(t, "", talosctl, append(q, "--value", token, "--limit", "1", "--json")...)
	if code != 0 || strings.Count(out, `"tool_call_id"`) != 1 {
		t.Fatalf("--limit 1: exit %d\n%s", code, out)
	}

	// A secret no call used: exit 0, says so.
	out, code = runWithStdin(t, "", talosctl, append(q, "--value", "never-used-secret-value")...)
	if code != 0 || !strings.Contains(out, "no recorded call used this secret") || strings.Contains(out, "never-used-secret-value") {
		t.Fatalf("unused secret: exit %d\n%s", code, out)
	}

	// Usage errors exit 2 without echoing the value.
	for name, args := range map[string][]string{
		"neither":       q,
		"both":          append(q, "--value", token, "--pseudonym", r.Pseudonym(token)),
		"bad pseudonym": append(q, "--pseudonym", "sha256:abc"),
		"no key":        append(append([]string{}, g...), "query", "secret-uses", "--redaction-key", filepath.Join(dir, "missing.key"), "--value", token),
		"empty stdin":   append(q, "--value", "-"),
	} {
		out, code := runWithStdin(t, "", talosctl, args...)
		if code != 2 || strings.Contains(out, token) {
			t.Errorf("%s: exit %d, want 2 (and no token)\n%s", name, code, out)
		}
	}
	if out, _ := runWithStdin(t, "", talosctl, "query", "--help"); !strings.Contains(out, "secret-uses") {
		t.Errorf("query --help does not list secret-uses:\n%s", out)
	}
}

// TestSinceTakesDays: --since takes days, as the dashboard's since=7d
// does, for the canned queries and export alike; a bad one is a usage
// error naming the forms.
func TestSinceTakesDays(t *testing.T) {
	day := 24 * time.Hour
	for _, tc := range []struct {
		args  []string
		since func(*cli) time.Duration
		want  time.Duration
	}{
		{[]string{"query", "denial-reasons", "--since", "7d"}, func(c *cli) time.Duration { return c.Query.Run.Since }, 7 * day},
		{[]string{"query", "run", "denial-reasons", "--since", "1d12h"}, func(c *cli) time.Duration { return c.Query.Run.Since }, day + 12*time.Hour},
		{[]string{"query", "denial-reasons", "--since", "24h"}, func(c *cli) time.Duration { return c.Query.Run.Since }, day},
		{[]string{"export", "--since", "30d"}, func(c *cli) time.Duration { return c.Export.Since }, 30 * day},
	} {
		var c cli
		parser, err := newParser(&c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parser.Parse(tc.args); err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if got := tc.since(&c); got != tc.want {
			t.Errorf("%q: --since %v, want %v", tc.args, got, tc.want)
		}
	}
	var c cli
	parser, err := newParser(&c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parser.Parse([]string{"query", "denial-reasons", "--since", "7days"}); err == nil || !strings.Contains(err.Error(), "7d, 1d12h") {
		t.Errorf("--since 7days: err %v, want one naming the forms", err)
	}
}
