package receipts_test

import (
	"fmt"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// A worker seals a receipt, publishes Sealed.JSON, and commits only once
// the stream has stored it; an auditor verifies it with the public key.
func ExampleChain() {
	key, err := receipts.GenerateKey()
	if err != nil {
		panic(err)
	}
	chain := receipts.NewChain("w1-0", key)

	receipt := &schemas.Receipt{
		EventType:  schemas.KindDecision,
		Tool:       "read_file",
		ToolCallID: "0190f5d2-7b3a-7c4e-8a1b-000000000001",
		ServerID:   "fs",
		ToolName:   "read_file",
		Decision:   schemas.DecisionAllow,
		ResultCode: schemas.DecisionAllow,
	}
	sealed, err := chain.Seal(receipts.Meta{
		Type:    schemas.TypeReceiptDecision,
		Source:  "talos://enforce/w1",
		Subject: receipt.ToolCallID,
		Time:    time.Date(2025, 3, 1, 12, 0, 0, 123e6, time.UTC),
		ID:      "0190f5d3-0000-7000-8000-000000000001",
	}, receipt)
	if err != nil {
		panic(err)
	}
	fmt.Println("seq", sealed.Seq, "prev genesis", sealed.PrevHash == schemas.GenesisHash)

	// ... publish sealed.JSON with Nats-Msg-Id; on success:
	if err := chain.Commit(sealed); err != nil {
		panic(err)
	}
	seq, head := chain.Head()
	fmt.Println("head", seq, head == sealed.Hash)

	keys := verify.KeySet{}
	keys.Add(key.Public())
	ev, err := verify.VerifyEvent(sealed.JSON, keys)
	if err != nil {
		panic(err)
	}
	fmt.Println(ev.ID, ev.Time, ev.Data.Decision, ev.Hash == sealed.Hash)
	// Output:
	// seq 1 prev genesis true
	// head 1 true
	// 0190f5d3-0000-7000-8000-000000000001 2025-03-01T12:00:00.123Z allow true
}
