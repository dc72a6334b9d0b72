package tlog

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"

	"github.com/transparency-dev/merkle/rfc6962"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// MaxEntryBytes is the largest entry C2SP tlog-tiles can hold (its
// length prefix is 16 bits).
const MaxEntryBytes = 1<<16 - 1

// OversizeType names the stand-in entry of a record larger than
// MaxEntryBytes (a ToolCallEvent carrying large redacted payloads): the
// RFC 8785 JSON {event_id, sha256, size, subject, type} of the record,
// sha256 being the lowercase hex of its exact bytes. A checker rebuilds it
// from the stored record (OversizeEntry) and finds it at the announced index.
const OversizeType = "dev.talos.log.oversize.v1"

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
	sum := sha256.Sum256(data)
	var b []byte
	b = append(b, `{"event_id":`...)
	b = jsonkit.AppendString(b, eventID)
	b = append(b, `,"sha256":"`...)
	b = hex.AppendEncode(b, sum[:])
	b = append(b, `","size":`...)
	b = strconv.AppendInt(b, int64(len(data)), 10)
	b = append(b, `,"subject":`...)
	b = jsonkit.AppendString(b, subject)
	b = append(b, `,"type":"`+OversizeType+`"}`...)
	return b
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
