package query

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/talos-audit/talos/receipts/verify"
)

// VerifyOutcome is a verification report as talosctl verify prints it:
// where the records came from, the report with its problems sorted
// (SortProblems), and how many problems fall in each Category.
type VerifyOutcome struct {
	Source string
	Report verify.Report
	Counts map[string]int
	// Log is the transparency log's check (AddLog), nil without one.
	Log *LogReport
	// Rejected is what an export's rejected ToolCallEvents showed
	// (VerifyExport), nil when it has none.
	Rejected *RejectedSummary
	// Replica is what the ClickHouse replica read still had to fetch
	// (VerifyDatabaseOutcome), nil when nothing.
	Replica *ReplicaBacklog
	// File: the records came from a file (VerifyExport), which has no
	// stored columns to check.
	File bool
}

// AddLog adds the transparency log's check: its problems join the
// report's.
func (o *VerifyOutcome) AddLog(l *LogReport) {
	o.Log = l
	o.Report.Problems = append(o.Report.Problems, l.Problems...)
	o.Counts = SortProblems(o.Report.Problems)
}

// NewVerifyOutcome sorts rep's problems and counts them per category;
// source names the records (a file, or a database).
func NewVerifyOutcome(source string, rep verify.Report) *VerifyOutcome {
	counts := SortProblems(rep.Problems)
	return &VerifyOutcome{Source: source, Report: rep, Counts: counts}
}

// scope is what was verified: receipts, chains and checkpoints seen.
func (o *VerifyOutcome) scope() string {
	r := &o.Report
	return fmt.Sprintf("%d receipts in %d chains, %d checkpoints", r.Checked, len(r.Chains), r.CheckpointsSeen)
}

// Err is nil when no problem was found, else the one-line verdict:
// "FAILED: N problems (per category) in <scope> from <source>".
func (o *VerifyOutcome) Err() error {
	if o.Report.OK() {
		return nil
	}
	var parts []string
	for _, cat := range Categories {
		if o.Counts[cat] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", o.Counts[cat], cat))
		}
	}
	return fmt.Errorf("FAILED: %d problems (%s) in %s from %s", len(o.Report.Problems), strings.Join(parts, ", "), o.scope(), o.Source)
}

// WriteText writes one line per problem, its category first, and, when
// there is none, the "OK: ..." line naming what was verified and what
// could not be (receipts past the last checkpoint, unchecked checkpoints).
func (o *VerifyOutcome) WriteText(w io.Writer) error {
	r := &o.Report
	if o.Replica != nil {
		if _, err := fmt.Fprintln(w, o.Replica.warning()); err != nil {
			return err
		}
	}
	for _, p := range r.Problems {
		if _, err := fmt.Fprintf(w, "%-10s %s\n", strings.ToUpper(Category(p.Kind)), p.String()); err != nil {
			return err
		}
	}
	if !r.OK() {
		return nil
	}
	tail := ""
	if r.Uncovered > 0 {
		tail = fmt.Sprintf("; %d receipts follow the last checkpoint of their chain (hash-chained, not yet checkpointed)", r.Uncovered)
	}
	if r.CheckpointsUnchecked > 0 {
		tail += fmt.Sprintf("; %d checkpoints could not be compared with their receipts", r.CheckpointsUnchecked)
	}
	if o.Rejected != nil {
		tail += o.Rejected.summary()
	}
	if o.Log != nil {
		tail += "; " + o.Log.Summary()
	}
	columns := ", stored columns"
	if o.File {
		columns = ""
	}
	_, err := fmt.Fprintf(w, "OK: %s verified (signatures, chain links, %d Merkle roots%s) from %s%s\n",
		o.scope(), r.Checkpoints, columns, o.Source, tail)
	return err
}

// WriteJSON writes the outcome as one JSON object: the figures, the counts
// per category and each problem with its category.
func (o *VerifyOutcome) WriteJSON(w io.Writer) error {
	type problem struct {
		verify.Problem
		Category string `json:"category"`
	}
	r := &o.Report
	probs := make([]problem, len(r.Problems))
	for i, p := range r.Problems {
		probs[i] = problem{p, Category(p.Kind)}
	}
	out := map[string]any{"source": o.Source, "ok": r.OK(), "checked": r.Checked, "chains": len(r.Chains),
		"checkpoints_seen": r.CheckpointsSeen, "checkpoints_verified": r.Checkpoints,
		"checkpoints_unchecked": r.CheckpointsUnchecked, "uncheckpointed_receipts": r.Uncovered,
		"categories": o.Counts, "problems": probs}
	if o.Log != nil {
		out["log"] = o.Log
	}
	if o.Rejected != nil {
		out["rejected"] = o.Rejected
	}
	if o.Replica != nil {
		out["replica_backlog"] = o.Replica
	}
	return json.NewEncoder(w).Encode(out)
}
