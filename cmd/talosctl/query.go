package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/query"
)

// queryCmd groups the canned auditor questions: `query <name>` runs one of
// query.CannedQueries (the default sub-command, so "run" may be left out),
// `query list` lists them, `query secret-uses` has flags of its own.
type queryCmd struct {
	SecretUses secretUsesCmd `cmd:"" name:"secret-uses" help:"Every call that used a secret, found by its keyed pseudonym (the secret itself is never stored or printed)."`
	List       queryListCmd  `cmd:"" help:"List the canned queries: name, the filters each takes, what it answers."`
	Run        cannedCmd     `cmd:"" default:"withargs" help:"Run canned query <name> ('run' may be left out: talosctl query denial-reasons --since 24h)."`
}

type secretUsesCmd struct {
	Value        string `name:"value" help:"The secret to look for; '-' reads it from standard input (one line). Prefer '-' or TALOS_VALUE: arguments are visible to other local users. Never printed."`
	Pseudonym    string `name:"pseudonym" help:"Look for this pseudonym (hmac-sha256:<kid>:<hex>, as in a ToolCallEvent's redactions) instead of --value."`
	RedactionKey string `name:"redaction-key" type:"path" default:"talos-data/keys/redaction.key" help:"talosd's redaction key file (under its --data-dir), to compute the pseudonym of --value."`
	Limit        int    `name:"limit" default:"100" help:"At most this many calls, oldest first (0: all)."`
}

func (c *secretUsesCmd) Run(g *Globals) error {
	if (c.Value == "") == (c.Pseudonym == "") {
		return usage("query secret-uses: give exactly one of --value or --pseudonym")
	}
	if c.Limit < 0 {
		return usage("query secret-uses: --limit must be >= 0")
	}
	pseudonym, err := redact.LookupPseudonym(c.Value, c.Pseudonym, c.RedactionKey, os.Stdin)
	if err != nil {
		return usage("query secret-uses: %v", err)
	}
	ctx := context.Background()
	conn, err := g.clickhouse(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	uses, err := query.SecretUses(ctx, conn, g.ClickhouseDatabase, pseudonym, c.Limit)
	if err != nil {
		return failed("%v", err)
	}
	return query.WriteSecretUses(os.Stdout, g.JSON, pseudonym, uses)
}

// Help lists the canned queries under `talosctl query --help`.
func (queryCmd) Help() string {
	var b strings.Builder
	b.WriteString("Canned queries (talosctl query <name> [--from T] [--to T] [--since D] [--agent A] [--server S] [--tool T] [--limit N] [--format table|csv|json]):\n\n")
	for _, c := range query.CannedQueries() {
		fmt.Fprintf(&b, "  %-24s %s\n", c.Name, c.Help)
	}
	b.WriteString("\nTimes are RFC 3339 or a date (its midnight UTC); --to is exclusive. Unknown names exit 2.")
	return b.String()
}

// queryListCmd is `talosctl query list`.
type queryListCmd struct{}

func (c *queryListCmd) Run(g *Globals) error {
	return query.WriteCannedList(os.Stdout, g.JSON, query.CannedQueries())
}

// cannedCmd is `talosctl query [run] <name>`.
type cannedCmd struct {
	Name   string        `arg:"" optional:"" help:"The canned query (talosctl query list)."`
	From   string        `name:"from" help:"Start of the time range: RFC 3339, or a date (its midnight UTC)."`
	To     string        `name:"to" help:"End of the time range, exclusive: RFC 3339, or a date (its midnight UTC)."`
	Since  time.Duration `name:"since" help:"Start the time range this long before now (e.g. 24h, 7d, 1d12h), instead of --from."`
	Agent  string        `name:"agent" help:"Only this agent id."`
	Server string        `name:"server" help:"Only this server id."`
	Tool   string        `name:"tool" help:"Only this tool name."`
	Limit  int           `name:"limit" default:"100" help:"At most this many rows (1 to 10000)."`
	Format string        `name:"format" help:"table (default), csv, or json (an array of objects; also --json)."`
}

func (c *cannedCmd) Run(g *Globals) error {
	if c.Name == "" {
		return usage("query: name a canned query; run 'talosctl query list' to see them")
	}
	q, ok := query.LookupCanned(c.Name)
	if !ok {
		return usage("query: unknown canned query %q; run 'talosctl query list' to see them", c.Name)
	}
	format, p, err := q.ReadFlags(query.CannedFlags{Format: c.Format, JSON: g.JSON, From: c.From, To: c.To, Since: c.Since,
		Agent: c.Agent, Server: c.Server, Tool: c.Tool, Limit: c.Limit}, time.Now())
	if err != nil {
		return usage("query %s: %v", q.Name, err)
	}
	ctx := context.Background()
	conn, err := g.clickhouse(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	res, err := query.RunCanned(ctx, conn, g.ClickhouseDatabase, q.Name, p)
	if errors.Is(err, query.ErrInvalidParams) {
		return usage("%v", err)
	}
	if err != nil {
		return failed("%v", err)
	}
	return query.WriteResult(os.Stdout, format, res, c.Limit)
}
