package verify_test

import (
	"testing"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/internal/receipttest"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// synthLikeEvents are n sealed receipts shaped like talosctl synth's
// (about 1.2 KB each), by one key.
func synthLikeEvents(b *testing.B, n int) (verify.KeySet, [][]byte) {
	key := testKey(b, 1)
	keys := verify.KeySet{}
	keys.Add(key.Public())
	c := receipts.NewChain("synth-0", key)
	raws := make([][]byte, n)
	for i := range raws {
		r := receipttest.Receipt(i, 0)
		r.DocumentHashes = []schemas.DocumentHash{}
		s, err := c.Seal(testMeta(i), r)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Commit(s); err != nil {
			b.Fatal(err)
		}
		raws[i] = s.JSON
	}
	return keys, raws
}

// BenchmarkVerifyEvents is per-receipt verification in batches of 256, as
// the database verifier runs it, with each signature rule.
func BenchmarkVerifyEvents(b *testing.B) {
	keys, raws := synthLikeEvents(b, 256)
	for _, f := range []struct {
		name string
		fn   func([][]byte, verify.KeySet) ([]*verify.Event, []error)
	}{{"stdlib-rules", verify.VerifyEvents}, {"batch", verify.VerifyEventsBatch}} {
		b.Run(f.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, errs := f.fn(raws, keys); errs[0] != nil {
					b.Fatal(errs[0])
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(raws))/1000, "µs/event")
		})
	}
}

// BenchmarkParseSigned is the verifier's one parse of a stored receipt,
// everything but the signature check.
func BenchmarkParseSigned(b *testing.B) {
	keys, raws := synthLikeEvents(b, 64)
	b.SetBytes(int64(len(raws[0])))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, _, ok := verify.ParseSigned(raws[i%len(raws)], keys); !ok {
			b.Fatal("not parsed")
		}
		i++
	}
}
