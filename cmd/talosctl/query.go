package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"text/tabwriter"

	"github.com/talos-audit/talos/enforce/redact"
	"github.com/talos-audit/talos/query"
	"github.com/talos-audit/talos/schemas"
)

// queryCmd groups the canned auditor questions; each is a sub-command.
type queryCmd struct {
	SecretUses secretUsesCmd `cmd:"" name:"secret-uses" help:"Every call that used a secret, found by its keyed pseudonym (the secret itself is never stored or printed)."`
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
