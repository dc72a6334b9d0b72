package verify_test

import (
	"fmt"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// exampleKey is a fixed key so the examples' output is deterministic.
func exampleKey() *receipts.PrivateKey { return seededKey(0) }

func ExampleKeyID() {
	k := exampleKey()
	fmt.Println(k.KID, k.KID == verify.KeyID(k.Public()))
	// Output: 56475aa75463474c true
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
	verify.SortForVerify(events)

	keys := verify.KeySet{}
	keys.Add(key.Public())
	v := verify.NewVerifier(keys)
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
