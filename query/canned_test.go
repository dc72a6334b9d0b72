package query

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// The catalogue is what the web dashboard and talosctl build on: the
// required names, their leading columns, sorted, copied on the way out.
func TestCannedCatalogue(t *testing.T) {
	list := CannedQueries()
	want := map[string][]string{
		"calls-over-time":         {"hour", "calls", "denials"},
		"denial-reasons":          {"reason_code", "denials"},
		"denials-by-reason":       {"hour", "server_id", "reason_code", "denials"},
		"top-denied-agents":       {"agent_id", "denials"},
		"top-denied-tools":        {"server_id", "tool_name", "denials"},
		"write-calls-per-agent":   {"agent_id", "allowed", "denied"},
		"incident-timeline":       {"time", "verb", "scope", "target", "actor", "reason", "accepted", "code", "receipt_id"},
		"calls-during-killswitch": {"time", "tool_call_id", "agent_id", "server_id", "tool_name", "decision", "killswitch_target"},
		"registry-digests":        {"registry_digest", "first_seen", "last_seen", "calls"},
		"redaction-counts":        {"day", "rule", "redactions"},
		"latency-percentiles":     {"server_id", "tool_name", "calls", "p50_ms", "p90_ms", "p99_ms"},
		"mcp-requests":            {"method", "server_id", "tool_name", "requests", "denials"},
		"server-requests":         {"time", "parent_tool_call_id", "parent_method", "parent_tool_name", "tool_call_id", "method", "decision"},
	}
	if len(list) != len(want) {
		t.Errorf("%d canned queries, want %d", len(list), len(want))
	}
	if !slices.IsSortedFunc(list, func(a, b Canned) int { return strings.Compare(a.Name, b.Name) }) {
		t.Error("CannedQueries is not sorted by name")
	}
	views := map[string]bool{}
	for _, s := range []string{ViewReceipts, ViewDecisions, ViewDenialsByReason, ViewControlEvents, ViewToolCalls, ViewSecretUses,
		ViewRedactionCounts, ViewDenials, ViewWriteCalls, ViewIncidentTimeline, ViewKillSwitchIntervals, ViewCallsDuringKillSwitch,
		ViewRegistryDigests, ViewToolLatency, ViewMCPRequests, ViewServerRequests} {
		views[s] = true
	}
	for _, c := range list {
		cols, ok := want[c.Name]
		if !ok {
			t.Errorf("unexpected canned query %q", c.Name)
			continue
		}
		// The required columns come first, in order; more only at the end.
		if len(c.Columns) < len(cols) || !slices.Equal(c.Columns[:len(cols)], cols) {
			t.Errorf("%s: columns %v, want %v first", c.Name, c.Columns, cols)
		}
		if c.Help == "" || strings.Contains(c.Help, "\n") || !views[c.View] {
			t.Errorf("%s: help %q, view %q", c.Name, c.Help, c.View)
		}
		if !slices.Contains(c.Filters, FilterFrom) || !slices.Contains(c.Filters, FilterTo) {
			t.Errorf("%s: filters %v lack the time range", c.Name, c.Filters)
		}
		got, ok := LookupCanned(c.Name)
		if !ok || got.Name != c.Name || !slices.Equal(got.Columns, c.Columns) {
			t.Errorf("LookupCanned(%q) = %v, %v", c.Name, got, ok)
		}
	}
	// Callers get copies.
	list[0].Columns[0] = "changed"
	if c, _ := LookupCanned(list[0].Name); c.Columns[0] == "changed" {
		t.Error("CannedQueries shares its slices with the catalogue")
	}
	if _, ok := LookupCanned("nope"); ok {
		t.Error("LookupCanned found an unknown name")
	}
}

func TestRunCannedErrors(t *testing.T) {
	ctx, conn, db := migrated(t)
	if _, err := RunCanned(ctx, conn, db, "drop-table", Params{}); !errors.Is(err, ErrUnknownQuery) || !strings.Contains(err.Error(), "drop-table") {
		t.Errorf("unknown name: %v", err)
	}
	if _, err := RunCanned(ctx, conn, db, "denial-reasons", Params{Limit: -1}); !errors.Is(err, ErrInvalidParams) {
		t.Errorf("negative limit: %v", err)
	}
	if _, err := RunCanned(ctx, conn, db, "denial-reasons", Params{From: wlH1, To: wlH0}); !errors.Is(err, ErrInvalidParams) {
		t.Errorf("from after to: %v", err)
	}
	if _, err := RunCanned(ctx, conn, "bad;db", "denial-reasons", Params{}); err == nil {
		t.Error("invalid database name accepted")
	}
	// An empty database: every query runs and returns no rows (not nil).
	for _, c := range CannedQueries() {
		res, err := RunCanned(ctx, conn, db, c.Name, Params{From: wlH0, To: wlH1, Agent: "a", Server: "s", Tool: "t", Limit: MaxLimit + 1})
		if err != nil {
			t.Errorf("%s on an empty database: %v", c.Name, err)
			continue
		}
		if res.Rows == nil || len(res.Rows) != 0 {
			t.Errorf("%s on an empty database: rows %v", c.Name, res.Rows)
		}
	}
}
