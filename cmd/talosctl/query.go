package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
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

// pseudonymPattern is the form of a redaction pseudonym (the schema's).
var pseudonymPattern = regexp.MustCompile(`^hmac-sha256:[^:\s]+:[0-9a-f]{64}$`)

func (c *secretUsesCmd) Run(g *Globals) error {
	if (c.Value == "") == (c.Pseudonym == "") {
		return usage("query secret-uses: give exactly one of --value or --pseudonym")
	}
	if c.Limit < 0 {
		return usage("query secret-uses: --limit must be >= 0")
	}
	pseudonym := c.Pseudonym
	if pseudonym != "" {
		if !pseudonymPattern.MatchString(pseudonym) {
			return usage("query secret-uses: --pseudonym is not of the form hmac-sha256:<kid>:<64 hex digits>")
		}
	} else {
		secret := c.Value
		if secret == "-" {
			var err error
			if secret, err = readSecretLine(os.Stdin); err != nil {
				return usage("query secret-uses: read the secret from standard input: %v", err)
			}
		}
		var err error
		if pseudonym, err = pseudonymOf(c.RedactionKey, secret); err != nil {
			return usage("query secret-uses: %v", err)
		}
	}

	ctx := context.Background()
	conn, err := query.Open(ctx, g.ClickhouseAddr, g.ClickhouseDatabase)
	if err != nil {
		return failed("clickhouse %s: %v", g.ClickhouseAddr, err)
	}
	defer conn.Close()
	uses, err := query.SecretUses(ctx, conn, g.ClickhouseDatabase, pseudonym, c.Limit)
	if err != nil {
		return failed("%v", err)
	}
	return printSecretUses(os.Stdout, g.JSON, pseudonym, uses)
}

// readSecretLine reads one line (without its line ending) from r.
func readSecretLine(r io.Reader) (string, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	if line == "" {
		return "", errors.New("empty")
	}
	return line, nil
}

// pseudonymOf computes the pseudonym talosd records for secret, with the
// key at keyPath. The key is never created here: a new key would match
// nothing.
func pseudonymOf(keyPath, secret string) (string, error) {
	key, kid, err := redact.LoadOrCreateKey(keyPath, false)
	if errors.Is(err, redact.ErrNoKey) {
		return "", fmt.Errorf("no redaction key at %s (talosd writes it under its --data-dir; pass --redaction-key)", keyPath)
	}
	if err != nil {
		return "", err
	}
	r, err := redact.New(redact.Config{Key: key, KeyID: kid})
	if err != nil {
		return "", err
	}
	return r.Pseudonym(secret), nil
}

// secretUseJSON is one line of `query secret-uses --json`.
type secretUseJSON struct {
	Time       string `json:"time"`
	ToolCallID string `json:"tool_call_id"`
	AgentID    string `json:"agent_id"`
	ServerID   string `json:"server_id"`
	ToolName   string `json:"tool_name"`
	Pointer    string `json:"pointer"`
	Rule       string `json:"rule"`
}

func printSecretUses(w io.Writer, asJSON bool, pseudonym string, uses []query.SecretUse) error {
	if asJSON {
		out := struct {
			Pseudonym string          `json:"pseudonym"`
			Uses      []secretUseJSON `json:"uses"`
		}{Pseudonym: pseudonym, Uses: []secretUseJSON{}}
		for _, u := range uses {
			out.Uses = append(out.Uses, secretUseJSON{Time: u.Time.UTC().Format(schemas.TimeFormat), ToolCallID: u.ToolCallID,
				AgentID: u.AgentID, ServerID: u.ServerID, ToolName: u.ToolName, Pointer: u.Pointer, Rule: u.Rule})
		}
		return json.NewEncoder(w).Encode(out)
	}
	if len(uses) == 0 {
		_, err := fmt.Fprintf(w, "no recorded call used this secret (pseudonym %s)\n", pseudonym)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tTOOL_CALL_ID\tAGENT\tSERVER\tTOOL\tPOINTER\tRULE")
	for _, u := range uses {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", u.Time.UTC().Format(schemas.TimeFormat), u.ToolCallID,
			orDash(u.AgentID), orDash(u.ServerID), orDash(u.ToolName), u.Pointer, u.Rule)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d call(s) used this secret (pseudonym %s)\n", len(uses), pseudonym)
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
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

// cannedJSON is one line of `query list --json`.
type cannedJSON struct {
	Name    string   `json:"name"`
	Help    string   `json:"help"`
	View    string   `json:"view"`
	Columns []string `json:"columns"`
	Filters []string `json:"filters"`
}

func (c *queryListCmd) Run(g *Globals) error {
	list := query.CannedQueries()
	if g.JSON {
		out := make([]cannedJSON, 0, len(list))
		for _, q := range list {
			out = append(out, cannedJSON{Name: q.Name, Help: q.Help, View: q.View, Columns: q.Columns, Filters: q.Filters})
		}
		return json.NewEncoder(os.Stdout).Encode(out)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tFILTERS\tVIEW\tANSWERS")
	for _, q := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", q.Name, strings.Join(q.Filters, ","), q.View, q.Help)
	}
	return tw.Flush()
}

// cannedCmd is `talosctl query [run] <name>`.
type cannedCmd struct {
	Name   string        `arg:"" optional:"" help:"The canned query (talosctl query list)."`
	From   string        `name:"from" help:"Start of the time range: RFC 3339, or a date (its midnight UTC)."`
	To     string        `name:"to" help:"End of the time range, exclusive: RFC 3339, or a date (its midnight UTC)."`
	Since  time.Duration `name:"since" help:"Start the time range this long before now (e.g. 24h), instead of --from."`
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
	format := c.Format
	switch {
	case format == "" && g.JSON:
		format = "json"
	case format == "":
		format = "table"
	case format != "table" && format != "csv" && format != "json":
		return usage("query %s: --format %q: want table, csv or json", q.Name, format)
	case g.JSON && format != "json":
		return usage("query %s: --json contradicts --format %s", q.Name, format)
	}
	if c.Limit < 1 || c.Limit > query.MaxLimit {
		return usage("query %s: --limit must be 1 to %d", q.Name, query.MaxLimit)
	}
	from, to, err := timeRange(c.From, c.To, c.Since, time.Now())
	if err != nil {
		return usage("query %s: %v", q.Name, err)
	}
	p := query.Params{From: from, To: to, Agent: c.Agent, Server: c.Server, Tool: c.Tool, Limit: c.Limit}
	given := map[string]bool{query.FilterFrom: !from.IsZero(), query.FilterTo: !to.IsZero(),
		query.FilterAgent: c.Agent != "", query.FilterServer: c.Server != "", query.FilterTool: c.Tool != ""}
	for _, f := range []string{query.FilterFrom, query.FilterTo, query.FilterAgent, query.FilterServer, query.FilterTool} {
		if given[f] && !slices.Contains(q.Filters, f) {
			return usage("query %s: takes no --%s (its filters: %s)", q.Name, f, strings.Join(q.Filters, ", "))
		}
	}

	ctx := context.Background()
	conn, err := query.Open(ctx, g.ClickhouseAddr, g.ClickhouseDatabase)
	if err != nil {
		return failed("clickhouse %s: %v", g.ClickhouseAddr, err)
	}
	defer conn.Close()
	res, err := query.RunCanned(ctx, conn, g.ClickhouseDatabase, q.Name, p)
	if errors.Is(err, query.ErrInvalidParams) {
		return usage("%v", err)
	}
	if err != nil {
		return failed("%v", err)
	}
	return printResult(os.Stdout, format, res, c.Limit)
}

// timeRange reads --from, --to and --since (relative to now).
func timeRange(fromS, toS string, since time.Duration, now time.Time) (from, to time.Time, err error) {
	if fromS != "" && since != 0 {
		return from, to, errors.New("give --from or --since, not both")
	}
	if since < 0 {
		return from, to, errors.New("--since must be positive")
	}
	if from, err = parseWhen(fromS); err != nil {
		return from, to, fmt.Errorf("--from: %v", err)
	}
	if to, err = parseWhen(toS); err != nil {
		return from, to, fmt.Errorf("--to: %v", err)
	}
	if since > 0 {
		from = now.Add(-since)
	}
	if !from.IsZero() && !to.IsZero() && !from.Before(to) {
		return from, to, errors.New("the time range is empty (--from is not before --to)")
	}
	return from, to, nil
}

// parseWhen reads RFC 3339 or a date (its midnight UTC); "" is the zero time.
func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is neither RFC 3339 (2026-06-01T12:00:00Z) nor a date (2026-06-01)", s)
}

// printResult writes res as a table, CSV or a JSON array of objects (keys
// in column order). limit is the row limit asked for, to say when it cut
// the result short.
func printResult(w io.Writer, format string, res *query.Result, limit int) error {
	switch format {
	case "json":
		var b bytes.Buffer
		b.WriteByte('[')
		for i, row := range res.Rows {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('{')
			for j, col := range res.Columns {
				if j > 0 {
					b.WriteByte(',')
				}
				k, _ := json.Marshal(col)
				v, err := json.Marshal(jsonValue(col, row[j]))
				if err != nil {
					return err
				}
				b.Write(k)
				b.WriteByte(':')
				b.Write(v)
			}
			b.WriteByte('}')
		}
		b.WriteString("]\n")
		_, err := w.Write(b.Bytes())
		return err
	case "csv":
		cw := csv.NewWriter(w)
		if err := cw.Write(res.Columns); err != nil {
			return err
		}
		for _, row := range res.Rows {
			rec := make([]string, len(row))
			for j, v := range row {
				rec[j] = textValue(res.Columns[j], v, false)
			}
			if err := cw.Write(rec); err != nil {
				return err
			}
		}
		cw.Flush()
		return cw.Error()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(res.Columns, "\t")))
	for _, row := range res.Rows {
		cells := make([]string, len(row))
		for j, v := range row {
			cells[j] = textValue(res.Columns[j], v, true)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more := ""
	if len(res.Rows) == limit {
		more = fmt.Sprintf(" (the --limit of %d: there may be more)", limit)
	}
	_, err := fmt.Fprintf(w, "%d row(s)%s\n", len(res.Rows), more)
	return err
}

// textValue renders one value for a table (human: empty as "-", floats
// with two decimals) or CSV (exact). Times are RFC 3339 in UTC with
// milliseconds; a "day" column is a date.
func textValue(col string, v any, human bool) string {
	switch x := v.(type) {
	case time.Time:
		if col == "day" {
			return x.UTC().Format(time.DateOnly)
		}
		return x.UTC().Format(schemas.TimeFormat)
	case []string:
		if human {
			return orDash(strings.Join(x, ","))
		}
		return strings.Join(x, ";")
	case float64:
		if human {
			return strconv.FormatFloat(x, 'f', 2, 64)
		}
		return strconv.FormatFloat(x, 'f', -1, 64)
	case string:
		if human {
			return orDash(x)
		}
		return x
	}
	return fmt.Sprint(v)
}

// jsonValue is v as it goes into JSON: times as RFC 3339 strings (a "day"
// column as a date), everything else as is.
func jsonValue(col string, v any) any {
	if t, ok := v.(time.Time); ok {
		return textValue(col, t, false)
	}
	return v
}
