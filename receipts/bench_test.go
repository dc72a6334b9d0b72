package receipts

import (
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts/internal/receipttest"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// benchReceipt is a receipt whose sealed event is about 2 KB.
func benchReceipt(b *testing.B) (*Chain, Meta, int) {
	c := NewChain("w1", testKey(b, 1))
	m := testMeta(1)
	s, err := c.Seal(m, receipttest.Receipt(1, 8))
	if err != nil {
		b.Fatal(err)
	}
	return c, m, len(s.JSON)
}

// BenchmarkSeal measures the hot path: canonical encoding, sha256 and one
// Ed25519 signature for a 2 KB receipt.
func BenchmarkSeal(b *testing.B) {
	c, m, size := benchReceipt(b)
	r := receipttest.Receipt(1, 8)
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
	r := receipttest.Receipt(1, 8)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Seal(m, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSignEvent signs the same 2 KB data outside a chain, as
// ToolCallEvents and control events are signed.
func BenchmarkSignEvent(b *testing.B) {
	c, m, size := benchReceipt(b)
	m.Type = schemas.TypeToolCall
	r := receipttest.Receipt(1, 8)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := SignEvent(c.key, m, r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	c, m, size := benchReceipt(b)
	s, err := c.Seal(m, receipttest.Receipt(1, 8))
	if err != nil {
		b.Fatal(err)
	}
	keys := verify.KeySet{}
	keys.Add(c.key.Public())
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := verify.VerifyEvent(s.JSON, keys); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMarshalCanonical and BenchmarkMarshalThenJCS compare the
// one-pass encoder with the marshal → parse → canonicalize round trip.
func BenchmarkMarshalCanonical(b *testing.B) {
	r := receipttest.Receipt(1, 8)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := jsonkit.MarshalCanonical(r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMarshalThenJCS(b *testing.B) {
	r := receipttest.Receipt(1, 8)
	b.ReportAllocs()
	for b.Loop() {
		j, err := json.Marshal(r)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := jsonkit.Canonicalize(j); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSign is the Ed25519 signature alone, over a 32-byte receipt
// hash: the floor under BenchmarkSeal.
func BenchmarkSign(b *testing.B) {
	key := testKey(b, 1)
	var sum [32]byte
	for b.Loop() {
		Sign(key.Key, sum[:])
	}
}

// BenchmarkEd25519 compares the signing and verification this package uses
// (curve25519-voi with precomputed keys, crypto/ed25519's bytes and accept
// set) with crypto/ed25519 itself, over a 32-byte hash: the reason for the
// choice, measured on the machine at hand.
func BenchmarkEd25519(b *testing.B) {
	key := testKey(b, 1)
	pub := key.Key.Public().(ed25519.PublicKey)
	var sum [32]byte
	sig := ed25519.Sign(key.Key, sum[:])
	b.Run("sign/crypto-ed25519", func(b *testing.B) {
		for b.Loop() {
			ed25519.Sign(key.Key, sum[:])
		}
	})
	b.Run("sign/voi", func(b *testing.B) {
		for b.Loop() {
			Sign(key.Key, sum[:])
		}
	})
	b.Run("verify/crypto-ed25519", func(b *testing.B) {
		for b.Loop() {
			if !ed25519.Verify(pub, sum[:], sig) {
				b.Fatal("bad signature")
			}
		}
	})
	b.Run("verify/voi", func(b *testing.B) {
		for b.Loop() {
			if !verify.Verify(pub, sum[:], sig) {
				b.Fatal("bad signature")
			}
		}
	})
}

// BenchmarkSignEventPayloads signs an event carrying 2 KB of redacted
// payloads (as a ToolCallEvent does) held as jsonkit.Canonical, appended
// as they are, and as json.RawMessage, which the canonical encoder parses
// and encodes again: the same bytes, in one run.
func BenchmarkSignEventPayloads(b *testing.B) {
	args, err := jsonkit.CanonicalTree(map[string]any{"path": "bench/" + strings.Repeat("x", 1300), "recursive": true})
	if err != nil {
		b.Fatal(err)
	}
	result, err := jsonkit.CanonicalTree(map[string]any{"entries": []any{"a.txt", "b.txt", strings.Repeat("y", 600)}})
	if err != nil {
		b.Fatal(err)
	}
	type canonical struct {
		Args   jsonkit.Canonical `json:"args"`
		Result jsonkit.Canonical `json:"result"`
	}
	type raw struct {
		Args   json.RawMessage `json:"args"`
		Result json.RawMessage `json:"result"`
	}
	key, m := testKey(b, 1), testMeta(1)
	m.Type = schemas.TypeToolCall
	for _, tc := range []struct {
		name string
		v    any
	}{
		{"Canonical", &canonical{args, result}},
		{"RawMessage", &raw{args, result}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := SignEvent(key, m, tc.v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSealFlight is one chain's work for a call and its post event,
// as under flight load: a pre receipt, a bigger post receipt and a
// ToolCallEvent signed with the chain's key, in turn (sealed, not
// committed). Its B/op shows whether the buffers fit the first time.
func BenchmarkSealFlight(b *testing.B) {
	c, m, _ := benchReceipt(b)
	pre, post := receipttest.Receipt(1, 8), receipttest.Receipt(1, 24)
	post.Phase, post.EventType = schemas.PhasePost, schemas.KindEffect
	ev := map[string]any{"tool_call_id": pre.ToolCallID, "args": strings.Repeat("a", 4500)}
	em := m
	em.Type = schemas.TypeToolCall
	b.ReportAllocs()
	for b.Loop() {
		m.Type = schemas.TypeReceiptDecision
		if _, err := c.Seal(m, pre); err != nil {
			b.Fatal(err)
		}
		m.Type = schemas.TypeReceiptEffect
		if _, err := c.Seal(m, post); err != nil {
			b.Fatal(err)
		}
		if _, err := c.SignEvent(em, ev); err != nil {
			b.Fatal(err)
		}
	}
}
