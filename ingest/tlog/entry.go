package tlog

import (
	"encoding/json"

	"github.com/transparency-dev/merkle/rfc6962"

	"github.com/talos-audit/talos/receipts/logproof"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// MaxEntryBytes is the largest entry C2SP tlog-tiles can hold (its
// length prefix is 16 bits).
const MaxEntryBytes = logproof.MaxEntryBytes

// OversizeType names the stand-in entry of a record larger than
// MaxEntryBytes (a ToolCallEvent carrying large redacted payloads):
// logproof.StandIn. A checker rebuilds it from the stored record and finds
// it at the announced index.
const OversizeType = logproof.StandInType

// EntryOf is the log entry of a TALOS_AUDIT record: its exact bytes, or
// its stand-in when it is larger than MaxEntryBytes.
func EntryOf(subject string, data []byte) (entry []byte, oversize bool) {
	if len(data) <= MaxEntryBytes {
		return data, false
	}
	return OversizeEntry(subject, EventID(data), data), true
}

// OversizeEntry is the stand-in entry of an oversize record.
func OversizeEntry(subject, eventID string, data []byte) []byte {
	return logproof.StandIn(subject, eventID, data)
}

// LeafHash is the RFC 6962 leaf hash of entry: sha256(0x00 ‖ entry).
func LeafHash(entry []byte) [32]byte { return [32]byte(rfc6962.DefaultHasher.HashLeaf(entry)) }

// EventID is the CloudEvent id of a record ("" when it has none): read
// in place from canonical JSON, else decoded.
func EventID(data []byte) string {
	if m, found, _, err := jsonkit.FindMember(data, 0, "id"); err == nil && found {
		var id string
		if json.Unmarshal(data[m.ValStart:m.End], &id) == nil {
			return id
		}
	}
	var ev struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(data, &ev)
	return ev.ID
}
