package ingest

import (
	"encoding/json"
	"testing"

	"github.com/talos-audit/talos/schemas"
)

func TestEncodeDecisionSplicesReceipt(t *testing.T) {
	d := &schemas.Decision{ToolCallID: "t", Phase: "pre", Decision: "deny", ReasonCodes: []string{"X"},
		ReceiptID: "r", Receipt: json.RawMessage(`{"id":"r","data":{"receipt":null}}`), Details: []string{`say "receipt":null`}}
	b, err := encodeDecision(d)
	if err != nil {
		t.Fatal(err)
	}
	var back schemas.Decision
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if string(back.Receipt) != string(d.Receipt) || back.Details[0] != d.Details[0] || back.Decision != "deny" {
		t.Fatalf("round trip: %s", b)
	}
}
