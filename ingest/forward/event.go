package forward

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// Event is one TALOS_AUDIT record as it is forwarded: its exact stored
// bytes and the few fields SIEMs index, read from them. Every field comes
// from the signed record, which holds hashes and redacted data only.
type Event struct {
	// ID is the CloudEvent id (a receipt's id is its receipt_id); a record
	// that is no CloudEvent gets "stream-seq-<n>". A redelivered event
	// carries the same ID, so duplicates are recognisable.
	ID        string
	Type      string // CloudEvent type (dev.talos.receipt.decision.v1, …)
	Time      string // CloudEvent time, RFC 3339
	Agent     string // agent_id (control receipts: the responder)
	Tool      string // tool_id <server_id>/<tool_name> (control receipts: the verb)
	Decision  string
	Reasons   []string
	ReceiptID string // the receipt's id, or the one a ToolCallEvent names
	Subject   string // the TALOS_AUDIT subject
	StreamSeq uint64
	// Raw is the record exactly as stored: the signed CloudEvent.
	Raw []byte
	// JSON reports whether Raw is a JSON object; a record that is not is
	// still forwarded (as a string where JSON is needed), never dropped.
	JSON bool
}

// ceFields are the members read from a CloudEvent.
type ceFields struct {
	ID   string `json:"id"`
	Type string `json:"type"`
	Time string `json:"time"`
	Data struct {
		AgentID     string   `json:"agent_id"`
		ToolID      string   `json:"tool_id"`
		Tool        string   `json:"tool"`
		Decision    string   `json:"decision"`
		ReasonCodes []string `json:"reason_codes"`
		ReceiptID   string   `json:"receipt_id"`
		Actor       struct {
			AgentID string `json:"agent_id"`
		} `json:"actor"`
	} `json:"data"`
}

// ParseEvent reads the indexed fields of a TALOS_AUDIT record. It never
// fails: what cannot be read stays empty, and Raw is data.
func ParseEvent(subject string, data []byte, seq uint64) Event {
	e := Event{Subject: subject, StreamSeq: seq, Raw: data}
	var f ceFields
	if err := json.Unmarshal(data, &f); err == nil { // Unmarshal checks the whole record is valid JSON
		e.JSON = true
		e.ID, e.Type, e.Time = f.ID, f.Type, f.Time
		e.Agent = first(f.Data.AgentID, f.Data.Actor.AgentID)
		e.Tool = first(f.Data.ToolID, f.Data.Tool)
		e.Decision, e.Reasons = f.Data.Decision, f.Data.ReasonCodes
		e.ReceiptID = f.Data.ReceiptID
		if strings.HasPrefix(f.Type, "dev.talos.receipt.") {
			e.ReceiptID = f.ID
		}
	}
	if e.ID == "" {
		e.ID = "stream-seq-" + strconv.FormatUint(seq, 10)
	}
	return e
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Kind is the event's type without its dev.talos. prefix and version
// (receipt.decision, toolcall, checkpoint, …): the syslog MSGID.
func (e *Event) Kind() string {
	k := strings.TrimPrefix(e.Type, "dev.talos.")
	if i := strings.LastIndex(k, ".v"); i > 0 {
		k = k[:i]
	}
	if k == "" || len(k) > 32 || !printableASCII(k) {
		return "-"
	}
	return k
}

// Denied reports whether the event records a refusal.
func (e *Event) Denied() bool { return e.Decision == schemas.DecisionDeny }

// unixTime is the event's time in seconds since the epoch (HEC's time),
// or now when it has none.
func (e *Event) unixTime(now time.Time) float64 {
	t, err := time.Parse(time.RFC3339Nano, e.Time)
	if err != nil {
		t = now
	}
	return float64(t.UnixMilli()) / 1000
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 33 || s[i] > 126 {
			return false
		}
	}
	return true
}
