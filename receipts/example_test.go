package receipts_test

import (
	"fmt"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// exampleKey is a fixed key so the examples' output is deterministic.
func exampleKey() *receipts.PrivateKey {
	seed := make([]byte, 32)
	for i := range seed {
		seed[i] = byte(i)
	}
	k, err := receipts.NewKeyFromSeed(seed)
	if err != nil {
		panic(err)
	}
	return k
}

func ExampleCanonicalize() {
	out, err := receipts.Canonicalize([]byte(`{"b": [1.50, 1e3, "\u00e9"], "a": {"z": null, "\n": true}}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
	// Output: {"a":{"\n":true,"z":null},"b":[1.5,1000,"é"]}
}

func ExampleMarshalCanonical() {
	out, err := receipts.MarshalCanonical(schemas.Chain{ChainID: "w1-0", Seq: 7, PrevHash: "ab"})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
	// Output: {"chain_id":"w1-0","prev_hash":"ab","seq":7}
}

func ExampleKeyID() {
	k := exampleKey()
	fmt.Println(k.KID, k.KID == receipts.KeyID(k.Public()))
	// Output: 56475aa75463474c true
}

// A worker seals a receipt, publishes Sealed.JSON, and commits only once
// the stream has stored it; an auditor verifies it with the public key.
func ExampleChain() {
	key := exampleKey()
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

	keys := receipts.KeySet{}
	keys.Add(key.Public())
	ev, err := receipts.VerifyEvent(sealed.JSON, keys)
	if err != nil {
		panic(err)
	}
	fmt.Println(ev.ID, ev.Time, ev.Data.Decision, ev.Hash == sealed.Hash)
	// Output:
	// seq 1 prev genesis true
	// head 1 true
	// 0190f5d3-0000-7000-8000-000000000001 2025-03-01T12:00:00.123Z allow true
}

func ExampleVerifier() {
	key := exampleKey()
	chain := receipts.NewChain("w1-0", key)
	var published [][]byte
	for i := 1; i <= 4; i++ {
		s, err := chain.Seal(receipts.Meta{
			Type:   schemas.TypeReceiptDecision,
			Source: "talos://enforce/w1",
			Time:   time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC),
			ID:     fmt.Sprintf("receipt-%d", i),
		}, &schemas.Receipt{Decision: schemas.DecisionAllow})
		if err != nil {
			panic(err)
		}
		if err := chain.Commit(s); err != nil {
			panic(err)
		}
		published = append(published, s.JSON)
	}
	// Someone deletes receipt 3 and feeds the rest in any order.
	events := [][]byte{published[3], published[0], published[1]}
	receipts.SortForVerify(events)

	keys := receipts.KeySet{}
	keys.Add(key.Public())
	v := receipts.NewVerifier(keys)
	for _, raw := range events {
		v.Add(raw)
	}
	report := v.Finish()
	fmt.Println("ok:", report.OK(), "checked:", report.Checked, "chain:", report.Chains["w1-0"])
	for _, p := range report.Problems {
		fmt.Println(p)
	}
	// Output:
	// ok: false checked: 3 chain: {1 4 3 0}
	// chain_gap: receipt receipt-4 (chain w1-0 seq 4): seq 3 missing between receipt receipt-2 (seq 2) and receipt receipt-4 (seq 4)
}
