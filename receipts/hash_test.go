package receipts

import (
	"bytes"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// verify.ReceiptHash agrees with the verifier's hash on canonical input (fast
// path) and on re-indented input (slow path).
func TestReceiptHash(t *testing.T) {
	key, err := NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	c := NewChain("hash-test", key)
	s, err := c.Seal(Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/t", Subject: "x", Time: time.Unix(1, 0)},
		&schemas.Receipt{EventType: "decision", Decision: "allow", Phase: "pre", Mode: "prod", ReasonCodes: []string{}, DocumentHashes: []schemas.DocumentHash{}})
	if err != nil {
		t.Fatal(err)
	}
	keys := verify.KeySet{}
	keys.Add(key.Public())
	ev, err := verify.VerifyEvent(s.JSON, keys)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := verify.ReceiptHash(s.JSON)
	if err != nil || fast != ev.Hash || fast != s.Hash {
		t.Fatalf("fast path %s (%v), want %s", fast, err, ev.Hash)
	}
	spaced := bytes.ReplaceAll(s.JSON, []byte(`,"`), []byte(`, "`))
	slow, err := verify.ReceiptHash(spaced)
	if err != nil || slow != ev.Hash {
		t.Fatalf("slow path %s (%v), want %s", slow, err, ev.Hash)
	}
	if _, err := verify.ReceiptHash([]byte(`{"data":{}}`)); err == nil {
		t.Fatal("an unsigned event has no receipt hash")
	}
}
