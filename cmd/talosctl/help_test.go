package main

import (
	"strings"
	"testing"

	"github.com/talos-audit/talos/testenv"
)

// TestHelpPutsCommandFlagsFirst: a command's --help lists its own flags
// before the NATS and ClickHouse connection flags every command shares,
// which come under titles of their own.
func TestHelpPutsCommandFlagsFirst(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	out, code := run(t, talosctl, "keys", "gen", "--help")
	if code != 0 {
		t.Fatalf("keys gen --help: exit %d\n%s", code, out)
	}
	own, nats, ch := strings.Index(out, "--out="), strings.Index(out, "NATS connection:"), strings.Index(out, "ClickHouse connection:")
	if own < 0 || nats < 0 || ch < 0 || !(own < nats && nats < ch) {
		t.Fatalf("keys gen --help: want --out, then \"NATS connection:\", then \"ClickHouse connection:\"\n%s", out)
	}
	if strings.Index(out, "--nats-url") < nats || strings.Index(out, "--clickhouse-addr") < ch {
		t.Fatalf("keys gen --help: the connection flags are not under their titles\n%s", out)
	}
}

// TestUsageErrorNamesCommandHelp: a usage error points at the --help of
// the command it is about, or talosctl's own when no command was named.
func TestUsageErrorNamesCommandHelp(t *testing.T) {
	talosctl := testenv.BuildBinary(t, "github.com/talos-audit/talos/cmd/talosctl")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keys", "gen", "--bogus"}, "run 'talosctl keys gen --help' for usage"},
		{[]string{"approve"}, "run 'talosctl approve --help' for usage"},
		{[]string{"bogus"}, "run 'talosctl --help' for usage"},
	} {
		out, code := run(t, talosctl, tc.args...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("talosctl %v: exit %d, want 2 and %q\n%s", tc.args, code, tc.want, out)
		}
	}
}
