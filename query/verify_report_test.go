package query

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/talos-audit/talos/receipts/verify"
)

// A clean report prints its OK line and no error; one with problems
// prints a line per problem, sorted, and fails naming the categories.
func TestVerifyOutcome(t *testing.T) {
	ok := NewVerifyOutcome("export.jsonl", verify.Report{Checked: 29, CheckpointsSeen: 4, Checkpoints: 4, Uncovered: 3,
		Chains: map[string]verify.ChainSummary{"w1": {}, "w2": {}}})
	var buf bytes.Buffer
	if err := ok.WriteText(&buf); err != nil || ok.Err() != nil {
		t.Fatal(err, ok.Err())
	}
	if want := "OK: 29 receipts in 2 chains, 4 checkpoints verified (signatures, chain links, 4 Merkle roots, stored columns) from export.jsonl" +
		"; 3 receipts follow the last checkpoint of their chain (hash-chained, not yet checkpointed)\n"; buf.String() != want {
		t.Fatalf("text %q", buf.String())
	}
	// A file has no stored columns to check.
	ok.File = true
	buf.Reset()
	if err := ok.WriteText(&buf); err != nil || !strings.HasPrefix(buf.String(), "OK: 29 receipts in 2 chains, 4 checkpoints verified (signatures, chain links, 4 Merkle roots) from export.jsonl;") {
		t.Fatalf("text of a file's %q (%v)", buf.String(), err)
	}

	bad := NewVerifyOutcome("ClickHouse db", verify.Report{Checked: 5, Chains: map[string]verify.ChainSummary{"w1": {}},
		Problems: []verify.Problem{
			{Kind: ProblemAlteredColumn, ReceiptID: "r4", ChainID: "w1", Seq: 4},
			{Kind: verify.ProblemChainGap, ReceiptID: "r2", ChainID: "w1", Seq: 2},
			{Kind: verify.ProblemUnknownKey, ReceiptID: "r3", ChainID: "w1", Seq: 3},
		}})
	buf.Reset()
	if err := bad.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "MISSING    ") || !strings.HasPrefix(lines[1], "FOREIGN    ") ||
		!strings.HasPrefix(lines[2], "ALTERED    ") || strings.Contains(buf.String(), "OK:") {
		t.Fatalf("text %q", buf.String())
	}
	if err := bad.Err(); err == nil || err.Error() != "FAILED: 3 problems (1 missing, 1 altered, 1 foreign) in 5 receipts in 1 chains, 0 checkpoints from ClickHouse db" {
		t.Fatalf("Err = %v", err)
	}
	buf.Reset()
	if err := bad.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Source     string
		OK         bool
		Categories map[string]int
		Problems   []struct{ Kind, Category string }
	}
	if err := json.Unmarshal(buf.Bytes(), &out); err != nil || out.OK || out.Source != "ClickHouse db" ||
		out.Categories["altered"] != 1 || len(out.Problems) != 3 || out.Problems[2].Category != "altered" {
		t.Fatalf("JSON %s (%v)", buf.String(), err)
	}
}

// A file's OK line counts the receipts after their chain's last
// checkpoint in the file, without claiming none covers them elsewhere; a
// file of receipts without any checkpoint fails once RequireCheckpoints
// is called, alone or after its problems, and says why.
func TestVerifyOutcomeOfFile(t *testing.T) {
	file := func(rep verify.Report) *VerifyOutcome {
		o := NewVerifyOutcome("receipts.jsonl", rep)
		o.File = true
		o.RequireCheckpoints()
		return o
	}
	chains := map[string]verify.ChainSummary{"w1": {}}
	anchored := file(verify.Report{Checked: 24, CheckpointsSeen: 1, Checkpoints: 1, Uncovered: 4, Chains: chains})
	var buf bytes.Buffer
	if err := anchored.WriteText(&buf); err != nil || anchored.Err() != nil || buf.String() != "OK: 24 receipts in 1 chains, 1 checkpoints verified "+
		"(signatures, chain links, 1 Merkle roots) from receipts.jsonl; 4 receipts follow the last checkpoint of their chain in the file (hash-chained only)\n" {
		t.Fatalf("text %q (%v, %v)", buf.String(), err, anchored.Err())
	}

	bare := file(verify.Report{Checked: 24, Uncovered: 24, Chains: chains})
	buf.Reset()
	if err := bare.WriteText(&buf); err != nil || buf.Len() != 0 || bare.OK() {
		t.Fatalf("text of a file without checkpoints %q (%v)", buf.String(), err)
	}
	if err := bare.Err(); err == nil || err.Error() != "FAILED: 24 receipts in 1 chains, 0 checkpoints from receipts.jsonl: "+noCheckpoints {
		t.Fatalf("Err = %v", err)
	}
	if err := bare.WriteJSON(&buf); err != nil || !strings.Contains(buf.String(), `"ok":false`) || !strings.Contains(buf.String(), `"no_checkpoints":"the file holds no checkpoint`) {
		t.Fatalf("JSON %s (%v)", buf.String(), err)
	}
	broken := file(verify.Report{Checked: 24, Chains: chains, Problems: []verify.Problem{{Kind: verify.ProblemChainGap, ReceiptID: "r2", ChainID: "w1", Seq: 2}}})
	if err := broken.Err(); err == nil || !strings.HasPrefix(err.Error(), "FAILED: 1 problems (1 missing) in 24 receipts") ||
		!strings.HasSuffix(err.Error(), "; and "+noCheckpoints) {
		t.Fatalf("Err = %v", err)
	}

	// Nothing to anchor (no receipt), or a database: no such failure.
	for _, o := range []*VerifyOutcome{file(verify.Report{Chains: map[string]verify.ChainSummary{}}), NewVerifyOutcome("ClickHouse db", verify.Report{Checked: 3, Chains: chains})} {
		o.RequireCheckpoints()
		if o.Err() != nil {
			t.Fatalf("%s: %v", o.Source, o.Err())
		}
	}
}
