// Package receipttest provides the deterministic keys, receipts and event
// metadata that the tests of receipts and receipts/verify sign and check.
//
// It imports neither: receipts' own tests, in package receipts, could not
// import a package that imports receipts. What takes a receipts type is
// passed in instead (Key's newKey) or converted by the caller (EventMeta).
package receipttest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// Key returns newKey's key of the 32-byte seed b, b+1, …, b+31; newKey is
// receipts.NewKeyFromSeed.
func Key[K any](newKey func(seed []byte) (K, error), b byte) K {
	seed := make([]byte, 32)
	for i := range seed {
		seed[i] = b + byte(i)
	}
	k, err := newKey(seed)
	if err != nil {
		panic(err) // 32 bytes is always a valid seed
	}
	return k
}

// Hash is the lowercase hex sha256 of s, as a receipt's hash fields hold one.
func Hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// ToolCallID is the tool_call_id of Receipt(i, …) and the subject of Meta(i).
func ToolCallID(i int) string {
	return fmt.Sprintf("0190f5d2-7b3a-7c4e-8a1b-%012d", i)
}

// Receipt is a realistic decision receipt; with docs=8 its canonical data
// is about 2 KB.
func Receipt(i, docs int) *schemas.Receipt {
	r := &schemas.Receipt{
		EventType:      schemas.KindDecision,
		Tool:           "write_file",
		CapabilityHash: Hash("cap"),
		RequestHash:    Hash(fmt.Sprint("req", i)),
		ResponseHash:   "",
		AgentID:        "agent-7",
		ToolID:         "fs/write_file",
		Timestamp:      "2025-03-01T12:00:00.123Z",
		ResultCode:     schemas.DecisionAllow,
		EnvelopeHash:   Hash(fmt.Sprint("env", i)),
		ToolCallID:     ToolCallID(i),
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
		RegistryDigest: "sha256:" + Hash("registry"),
		ContentHashAlg: schemas.ContentHashAlg,
	}
	for d := range docs {
		r.DocumentHashes = append(r.DocumentHashes, schemas.DocumentHash{
			Pointer:   fmt.Sprintf("/files/%d/content", d),
			Hash:      Hash(fmt.Sprint("doc", i, d)),
			SizeBytes: int64(1000 * (d + 1)),
		})
		r.BatchTotalBytes += int64(1000 * (d + 1))
	}
	return r
}

// Time is the time of Meta(0); tests read it and never assign it.
var Time = time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)

// EventMeta has the fields of receipts.Meta, in its order, so that
// receipts.Meta(Meta(i)) converts one.
type EventMeta struct {
	Type    string
	Source  string
	Subject string
	Time    time.Time
	ID      string
}

// Meta is the metadata of the decision receipt Receipt(i, …): its subject
// is the receipt's tool_call_id, its time i ms after Time.
func Meta(i int) EventMeta {
	return EventMeta{
		Type:    schemas.TypeReceiptDecision,
		Source:  "talos://enforce/w1",
		Subject: ToolCallID(i),
		Time:    Time.Add(time.Duration(i) * time.Millisecond),
		ID:      fmt.Sprintf("0190f5d3-0000-7000-8000-%012d", i),
	}
}
