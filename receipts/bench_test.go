package receipts

import (
	"encoding/json"
	"testing"
	"time"
)

// benchReceipt is a receipt whose sealed event is about 2 KB.
func benchReceipt(b *testing.B) (*Chain, Meta, int) {
	c := NewChain("w1", testKey(b, 1))
	m := testMeta(1)
	s, err := c.Seal(m, sampleReceipt(1, 8))
	if err != nil {
		b.Fatal(err)
	}
	return c, m, len(s.JSON)
}

// BenchmarkSeal measures the hot path: canonical encoding, sha256 and one
// Ed25519 signature for a 2 KB receipt.
func BenchmarkSeal(b *testing.B) {
	c, m, size := benchReceipt(b)
	r := sampleReceipt(1, 8)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Seal(m, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSealNewID is BenchmarkSeal with a fresh UUIDv7 and clock read.
func BenchmarkSealNewID(b *testing.B) {
	c, m, size := benchReceipt(b)
	m.ID = ""
	m.Time = time.Time{}
	r := sampleReceipt(1, 8)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Seal(m, r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	c, m, size := benchReceipt(b)
	s, err := c.Seal(m, sampleReceipt(1, 8))
	if err != nil {
		b.Fatal(err)
	}
	keys := KeySet{}
	keys.Add(c.key.Public())
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := VerifyEvent(s.JSON, keys); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMarshalCanonical and BenchmarkMarshalThenJCS compare the
// one-pass encoder with the marshal → parse → canonicalize round trip.
func BenchmarkMarshalCanonical(b *testing.B) {
	r := sampleReceipt(1, 8)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := MarshalCanonical(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMarshalThenJCS(b *testing.B) {
	r := sampleReceipt(1, 8)
	b.ReportAllocs()
	for b.Loop() {
		j, err := json.Marshal(r)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Canonicalize(j); err != nil {
			b.Fatal(err)
		}
	}
}
