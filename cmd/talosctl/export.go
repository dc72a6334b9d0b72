package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/talos-audit/talos/query"
)

// exportCmd is `talosctl export`: the signed records of ClickHouse, as
// stored, for an auditor to verify offline (verify --file) or to archive.
type exportCmd struct {
	Format string        `name:"format" default:"jsonl" enum:"jsonl,csv" help:"jsonl: one signed CloudEvent per line, the stored bytes (a rejected ToolCallEvent: a line with record toolcall_rejected, the reason and the stored event); csv: the useful columns and a cloudevent column with the signed JSON."`
	Kind   string        `name:"kind" default:"receipts" enum:"receipts,toolcalls,rejected,checkpoints,control,all" help:"What to export: receipts (in chain order; control receipts included; then the checkpoints over them, so that verify --file also catches a receipt removed from the end of a chain), toolcalls, rejected (the ToolCallEvents the flight recorder refused, as stored), checkpoints, control (the control receipts alone), or all (receipts, tool calls, rejected tool calls and checkpoints)."`
	From   string        `name:"from" help:"Only records from this time on: RFC 3339, or a date (its midnight UTC). A partial chain verifies with verify --partial."`
	To     string        `name:"to" help:"Only records before this time (exclusive): RFC 3339, or a date."`
	Since  time.Duration `name:"since" help:"Only records of the last D (e.g. 24h), instead of --from."`
	Out    string        `name:"out" short:"o" default:"-" help:"Write to this file ('-': standard output). The file appears only once complete (written beside it, then renamed)."`
}

// exportProgressEvery is how many records pass between progress lines.
const exportProgressEvery = 10000

func (c *exportCmd) Run(g *Globals) error {
	from, to, err := query.TimeRange(c.From, c.To, c.Since, time.Now())
	if err != nil {
		return usage("export: %v", err)
	}
	ctx := context.Background()
	conn, err := g.clickhouse(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()

	if _, err := query.NewExportWriter(io.Discard, c.Format); err != nil {
		return usage("export: %v", err)
	}
	toFile := c.Out != "-"
	progress := func(n int) {
		if toFile && n%exportProgressEvery == 0 {
			fmt.Fprintf(os.Stderr, "\rexported %d records…", n)
		}
	}
	opts := query.ExportOptions{Kind: c.Kind, From: from, To: to}
	var n int
	if toFile {
		n, err = query.ExportToPath(ctx, conn, g.ClickhouseDatabase, opts, c.Format, c.Out, progress)
	} else {
		n, err = query.ExportTo(ctx, conn, g.ClickhouseDatabase, opts, c.Format, os.Stdout, progress)
	}
	if toFile && n >= exportProgressEvery {
		fmt.Fprintln(os.Stderr)
	}
	// Conflicting copies are all in the export (the verifier names the
	// fork): it is kept, then fails.
	var conflict *query.ConflictError
	if err != nil && !errors.As(err, &conflict) {
		return failed("export: %v", err)
	}
	if toFile {
		if g.JSON {
			json.NewEncoder(os.Stdout).Encode(map[string]any{"out": c.Out, "kind": c.Kind, "format": c.Format, "records": n})
		} else {
			records := "records"
			if n == 1 {
				records = "record"
			}
			fmt.Fprintf(os.Stderr, "exported %d %s (%s) to %s (%s)\n", n, records, c.Kind, c.Out, c.Format)
		}
	}
	if conflict != nil {
		return failed("export: %v (every version is in the export; verify --file names them)", conflict)
	}
	return nil
}
