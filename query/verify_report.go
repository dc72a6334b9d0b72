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
	// unanchored: the file holds receipts and no checkpoint, and
	// RequireCheckpoints was called.
	unanchored bool
}

// RequireCheckpoints makes the outcome of a file (File) that holds
// receipts but no checkpoint a failure (Err), whatever else it found:
// nothing in such a file vouches for where its chains end, so a receipt
// removed from the end of a chain, or a whole chain, would not show. A
// caller that holds the file to a transparency log, which vouches for
// every record, need not call it.
func (o *VerifyOutcome) RequireCheckpoints() {
	o.unanchored = o.File && o.Report.Checked > 0 && o.Report.CheckpointsSeen == 0
}

// noCheckpoints says why an unanchored file fails, and what to do.
const noCheckpoints = "the file holds no checkpoint: without one, receipts removed from the end of a chain, or whole chains, " +
	"cannot be detected; export a file that holds the checkpoints with talosctl export (its default --kind receipts, or --kind all)"

// OK reports whether the outcome passes: no problem found, and a file
// that RequireCheckpoints was called on holds checkpoints.
func (o *VerifyOutcome) OK() bool { return o.Report.OK() && !o.unanchored }

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

// Err is nil when the outcome is OK, else the one-line verdict:
// "FAILED: N problems (per category) in <scope> from <source>", and, for
// a file without checkpoints (RequireCheckpoints), why that fails too.
func (o *VerifyOutcome) Err() error {
	switch {
	case o.OK():
		return nil
	case o.Report.OK():
		return fmt.Errorf("FAILED: %s from %s: %s", o.scope(), o.Source, noCheckpoints)
	}
	tail := ""
	if o.unanchored {
		tail = "; and " + noCheckpoints
	}
	var parts []string
	for _, cat := range Categories {
		if o.Counts[cat] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", o.Counts[cat], cat))
		}
	}
	return fmt.Errorf("FAILED: %d problems (%s) in %s from %s%s", len(o.Report.Problems), strings.Join(parts, ", "), o.scope(), o.Source, tail)
}

// WriteText writes one line per problem, its category first, and, when
// the outcome is OK, the "OK: ..." line naming what was verified and what
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
	if !o.OK() {
		return nil
	}
	tail := ""
	switch {
	case r.Uncovered > 0 && o.File:
		// A checkpoint the file does not hold may cover them.
		tail = fmt.Sprintf("; %d receipts follow the last checkpoint of their chain in the file (hash-chained only)", r.Uncovered)
	case r.Uncovered > 0:
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
	out := map[string]any{"source": o.Source, "ok": o.OK(), "checked": r.Checked, "chains": len(r.Chains),
		"checkpoints_seen": r.CheckpointsSeen, "checkpoints_verified": r.Checkpoints,
		"checkpoints_unchecked": r.CheckpointsUnchecked, "uncheckpointed_receipts": r.Uncovered,
		"categories": o.Counts, "problems": probs}
	if o.Log != nil {
		out["log"] = o.Log
	}
	if o.unanchored {
		out["no_checkpoints"] = noCheckpoints
	}
	if o.Rejected != nil {
		out["rejected"] = o.Rejected
	}
	if o.Replica != nil {
		out["replica_backlog"] = o.Replica
	}
	return json.NewEncoder(w).Encode(out)
}
