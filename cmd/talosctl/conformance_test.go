package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/ingest/conformance"
	"github.com/talos-audit/talos/testenv"
)

// TestConformanceAgainstStack runs talosctl conformance against a real
// stack (talosd with the demo registry, capabilities required, a
// responder and an issuer key, ClickHouse): every applicable test passes
// with its receipts, MUST 6 is not applicable with its reason, and the
// gateway rows without a gateway are not applicable, never pass.
func TestConformanceAgainstStack(t *testing.T) {
	talosd := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosd")
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	addr, db := testenv.NewDatabase(t)
	ns := testenv.NATSForTest(t)
	dir := t.TempDir()
	key := func(n string) string { return filepath.Join(dir, n) }
	genKeys(t, talosctl, dir, "worker", "responder", "issuer", "agent")
	if out, code := run(t, talosctl, "cap", "issue", "--issuer-key", key("issuer.key"), "--subject", "conformance-agent",
		"--subject-key", key("agent.pub"), "--scope", "tool:files:*", "--out", key("agent.cap.json")); code != 0 {
		t.Fatalf("cap issue: %s", out)
	}
	registry := "../talosd/demo/registry"
	startTalosd(t, talosd, dir, "--nats-url", ns.URL(), "--clickhouse-addr", addr, "--clickhouse-database", db,
		"--registry", registry, "--signing-key", key("worker.key"), "--responder-keys", key("responder.pub"),
		"--capability-issuers", key("issuer.pub"), "--capabilities", "required", "--http-addr", "", "--chains", "1", "--instance", "conf-worker")
	g := []string{"--nats-url", ns.URL(), "--nats-auth", "none", "--clickhouse-addr", addr, "--clickhouse-database", db}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, code := run(t, talosctl, append(g, "status", "--responder-key", key("responder.key"))...)
		if code == 0 && strings.Contains(out, "conf-worker") && strings.Contains(out, "true") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live worker: exit %d\n%s", code, out)
		}
		time.Sleep(200 * time.Millisecond)
	}

	out, code := runStdout(t, talosctl, append(g, "--json", "conformance", "--capability", key("agent.cap.json"), "--agent-key", key("agent.key"),
		"--issuer-key", key("issuer.key"), "--responder-key", key("responder.key"), "--trusted-keys", key("worker.pub"), "--registry", registry)...)
	var rep conformance.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("conformance --json: exit %d %v\n%s", code, err, out)
	}
	t.Logf("%d passed, %d failed, %d not applicable", rep.Passed, rep.Failed, rep.NA)
	byID := map[string]conformance.Result{}
	for _, r := range rep.Results {
		t.Logf("%-4s %-38s %-14s %s %v", r.Group, r.ID+" "+r.Check, r.Status, r.Reason, r.ReceiptIDs)
		byID[r.ID+"|"+r.Check] = r
		if r.Status == conformance.Fail {
			t.Errorf("%s %s failed: %s", r.ID, r.Check, r.Reason)
		}
		if r.Status == conformance.Pass && len(r.ReceiptIDs) == 0 && r.ID != "INV-01" {
			t.Errorf("%s %s passed without receipts", r.ID, r.Check)
		}
	}
	if code != 0 || rep.Failed != 0 {
		t.Fatalf("conformance: exit %d, %d failed", code, rep.Failed)
	}
	for _, id := range []string{"OAUTH-01", "OAUTH-02"} {
		if r := byID[id+"|"]; r.Status != conformance.NotApplicable || !strings.Contains(r.Reason, "no OAuth proxying") {
			t.Errorf("%s: %+v", id, r)
		}
	}
	for _, id := range []string{"AUTH-01", "AUTH-02", "TLS-01", "SAND-01", "NET-01", "DISC-01", "CRED-01"} {
		if r := byID[id+"|"]; r.Status != conformance.NotApplicable || !strings.Contains(r.Reason, "no gateway given") || r.Test == "" {
			t.Errorf("%s without a gateway: %+v", id, r)
		}
	}
	for _, id := range []string{"AUTHZ-01", "VAL-01", "VAL-02", "VAL-03", "RCPT-01", "RCPT-02", "INC-01", "CRED-03", "T-CHAIN-1",
		"test_proxy_requires_capability", "test_replayed_request_rejected", "test_delegation_chain_verification",
		"test_delegation_scope_widening_fails", "test_signature_context_confusion", "test_capability_mid_session_expiry"} {
		found := false
		for k, r := range byID {
			if strings.HasPrefix(k, id+"|") && r.Status == conformance.Pass {
				found = true
			}
		}
		if !found {
			t.Errorf("%s did not pass", id)
		}
	}
	if n := len(rep.Results); n < 35 {
		t.Errorf("%d rows", n)
	}
	// The table names the same rows.
	if out, code := run(t, talosctl, append(g, "conformance", "--capability", key("agent.cap.json"), "--agent-key", key("agent.key"), "--event-wait", "1s")...); !strings.Contains(out, "OAUTH-01") || !strings.Contains(out, "not applicable") || code > 1 {
		t.Fatalf("table: exit %d\n%s", code, out)
	}
}
