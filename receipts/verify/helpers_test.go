package verify_test

import (
	"testing"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/internal/receipttest"
)

// testKey returns a deterministic key from a one-byte seed pattern.
func testKey(t testing.TB, b byte) *receipts.PrivateKey {
	t.Helper()
	return seededKey(b)
}

// seededKey is testKey for helpers without a testing.TB.
func seededKey(b byte) *receipts.PrivateKey { return receipttest.Key(receipts.NewKeyFromSeed, b) }

// testMeta is the metadata of receipttest.Receipt(i, …).
func testMeta(i int) receipts.Meta { return receipts.Meta(receipttest.Meta(i)) }

// buildChain seals and commits n receipts on a chain and returns their JSON.
func buildChain(t testing.TB, c *receipts.Chain, n int) [][]byte {
	t.Helper()
	return buildLinks(t, c, 1, n, 2)
}

// buildLinks seals and commits receipttest.Receipt(i, docs) for i in
// [from, to] as the next links of c and returns them.
func buildLinks(t testing.TB, c *receipts.Chain, from, to, docs int) [][]byte {
	t.Helper()
	var out [][]byte
	for i := from; i <= to; i++ {
		s, err := c.Seal(testMeta(i), receipttest.Receipt(i, docs))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Commit(s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s.JSON)
	}
	return out
}
