package logproof

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// MaxEntryBytes is the largest entry C2SP tlog-tiles can hold (its
// length prefix is 16 bits).
const MaxEntryBytes = 1<<16 - 1

// StandInType names the stand-in entry of a record larger than
// MaxEntryBytes (a ToolCallEvent carrying large redacted payloads): the
// RFC 8785 JSON {event_id, sha256, size, subject, type} of the record,
// sha256 being the lowercase hex of its exact bytes.
const StandInType = "dev.talos.log.oversize.v1"

// entryOf is the log entry of a record published on subject: its exact
// bytes, or its stand-in when it is larger than MaxEntryBytes.
func entryOf(subject, eventID string, data []byte) (entry []byte, oversize bool) {
	if len(data) <= MaxEntryBytes {
		return data, false
	}
	return StandIn(subject, eventID, data), true
}

// StandIn is the stand-in entry of an oversize record.
func StandIn(subject, eventID string, data []byte) []byte {
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
	b = append(b, `,"type":"`+StandInType+`"}`...)
	return b
}

// Entry is what a log entry says about the record it holds.
type Entry struct {
	// EventID is the record's CloudEvent id ("" when the entry is not a
	// record Talos appends).
	EventID string
	// Type is the CloudEvent type, or StandInType.
	Type string
	// Time is the record's signed time in Unix milliseconds (0 when
	// unknown: a stand-in, or no parsable time).
	TimeMS int64
	// SHA256 and Size are a stand-in's account of its record (lowercase
	// hex); Subject its TALOS_AUDIT subject.
	SHA256  string
	Size    int64
	Subject string
}

// ReadEntry reads what entry is: a CloudEvent, or a stand-in.
func ReadEntry(entry []byte) Entry {
	var e struct {
		ID      string `json:"id"`
		EventID string `json:"event_id"`
		Type    string `json:"type"`
		Time    string `json:"time"`
		SHA256  string `json:"sha256"`
		Size    int64  `json:"size"`
		Subject string `json:"subject"`
	}
	if json.Unmarshal(entry, &e) != nil {
		return Entry{}
	}
	if e.Type == StandInType {
		return Entry{EventID: e.EventID, Type: e.Type, SHA256: e.SHA256, Size: e.Size, Subject: e.Subject}
	}
	out := Entry{EventID: e.ID, Type: e.Type}
	if t, err := time.Parse(time.RFC3339Nano, e.Time); err == nil {
		out.TimeMS = t.UnixMilli()
	}
	return out
}
