package verify_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// seededKey is testKey for helpers without a testing.TB.
func seededKey(b byte) *receipts.PrivateKey {
	seed := make([]byte, 32)
	for i := range seed {
		seed[i] = b + byte(i)
	}
	k, err := receipts.NewKeyFromSeed(seed)
	if err != nil {
		panic(err) // 32 bytes is always a valid seed
	}
	return k
}

func hexOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// sampleReceipt is a realistic decision receipt; with docs=8 its canonical
// data is about 2 KB.
func sampleReceipt(i, docs int) *schemas.Receipt {
	tcid := fmt.Sprintf("0190f5d2-7b3a-7c4e-8a1b-%012d", i)
	r := &schemas.Receipt{
		EventType:      schemas.KindDecision,
		Tool:           "write_file",
		CapabilityHash: hexOf("cap"),
		RequestHash:    hexOf(fmt.Sprint("req", i)),
		ResponseHash:   "",
		AgentID:        "agent-7",
		ToolID:         "fs/write_file",
		Timestamp:      "2025-03-01T12:00:00.123Z",
		ResultCode:     schemas.DecisionAllow,
		EnvelopeHash:   hexOf(fmt.Sprint("env", i)),
		ToolCallID:     tcid,
		TraceID:        "0190f5d2-7b3a-7c4e-8a1b-aaaaaaaaaaaa",
		CorrelationID:  "q2Xo9Fh3bTz1c5Vd8KpL0w",
		SessionID:      "sess-42",
		EPID:           "gw-1",
		ServerID:       "fs",
		ToolName:       "write_file",
		Phase:          schemas.PhasePre,
		Mode:           "prod",
		Decision:       schemas.DecisionAllow,
		ReasonCodes:    []string{},
		ToolClass:      schemas.ClassWrite,
		RegistryDigest: "sha256:" + hexOf("registry"),
		ContentHashAlg: schemas.ContentHashAlg,
	}
	for d := range docs {
		r.DocumentHashes = append(r.DocumentHashes, schemas.DocumentHash{
			Pointer:   fmt.Sprintf("/files/%d/content", d),
			Hash:      hexOf(fmt.Sprint("doc", i, d)),
			SizeBytes: int64(1000 * (d + 1)),
		})
		r.BatchTotalBytes += int64(1000 * (d + 1))
	}
	return r
}

func testMeta(i int) receipts.Meta {
	return receipts.Meta{
		Type:    schemas.TypeReceiptDecision,
		Source:  "talos://enforce/w1",
		Subject: fmt.Sprintf("0190f5d2-7b3a-7c4e-8a1b-%012d", i),
		Time:    testTime.Add(time.Duration(i) * time.Millisecond),
		ID:      fmt.Sprintf("0190f5d3-0000-7000-8000-%012d", i),
	}
}

var testTime = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

// testKey returns a deterministic key from a one-byte seed pattern.
func testKey(t testing.TB, b byte) *receipts.PrivateKey {
	t.Helper()
	return seededKey(b)
}

// buildChain seals and commits n receipts on a chain and returns their JSON.
func buildChain(t testing.TB, c *receipts.Chain, n int) [][]byte {
	t.Helper()
	return buildLinks(t, c, 1, n, 2)
}

// buildLinks seals and commits sampleReceipt(i, docs) for i in
// [from, to] as the next links of c and returns them.
func buildLinks(t testing.TB, c *receipts.Chain, from, to, docs int) [][]byte {
	t.Helper()
	var out [][]byte
	for i := from; i <= to; i++ {
		s, err := c.Seal(testMeta(i), sampleReceipt(i, docs))
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
