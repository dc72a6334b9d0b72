package query

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// ExportedRejection is how a JSON-lines export carries a ToolCallEvent
// the flight recorder refused (ExportRejected): one JSON object per line,
// told from a CloudEvent by Record, holding the stored event byte for
// byte in CloudEvent (a JSON string) and what the recorder said of it.
type ExportedRejection struct {
	Record    string   `json:"record"` // RecordToolCallRejected
	ID        string   `json:"id"`
	Time      string   `json:"time"`
	Subject   string   `json:"subject"`    // where it arrived on TALOS_AUDIT
	StreamSeq uint64   `json:"stream_seq"` // its TALOS_AUDIT sequence
	Missing   []string `json:"missing"`
	Reason    string   `json:"reason"`
	// PayloadsWithheld: the sink stored the event without its
	// data.payloads (RejectionOf), which its signature covers; the
	// transparency log holds it as received.
	PayloadsWithheld bool   `json:"payloads_withheld"`
	CloudEvent       string `json:"cloudevent"`
}

func exportedRejection(r *ExportRecord) ExportedRejection {
	rej := ToolCallRejection{Reason: r.Rejection}
	return ExportedRejection{Record: RecordToolCallRejected, ID: r.ID, Time: r.Time.UTC().Format(schemas.TimeFormat),
		Subject: r.Subject, StreamSeq: r.StreamSeq, Missing: nonNil(r.Missing), Reason: r.Rejection,
		PayloadsWithheld: rej.PayloadsWithheld(), CloudEvent: r.CloudEvent}
}

// ReadExportedRejection reads a line of an export as an
// ExportedRejection; ok is false for anything else (a CloudEvent).
func ReadExportedRejection(line []byte) (x ExportedRejection, ok bool) {
	if !bytes.Contains(line, []byte(RecordToolCallRejected)) || json.Unmarshal(line, &x) != nil {
		return ExportedRejection{}, false
	}
	return x, x.Record == RecordToolCallRejected
}

// RecordRejectedToolCall is verify.Problem.Record for a rejected
// ToolCallEvent of an export.
const RecordRejectedToolCall = "rejected tool call event"

// RejectedSummary is what verify --file found of an export's rejected
// ToolCallEvents. They are evidence of what the recorder refused, in no
// chain: each is checked on its own.
type RejectedSummary struct {
	Total int `json:"total"`
	// Signed: its signature by a trusted key holds on the stored bytes.
	Signed int `json:"signed"`
	// Withheld: stored without the payloads its signature covers, so the
	// signature cannot be checked from the file (the log holds the event
	// as received: --log-url finds it there).
	Withheld int `json:"withheld"`
	// Unsigned: not signed by a trusted key (malformed, or another key):
	// the recorder refused what an untrusted publisher sent.
	Unsigned int `json:"unsigned"`
}

// VerifyExport verifies the records of an export (talosctl verify --file):
// the signed records with verify.VerifyFile (partial, batch as there), and
// each rejected ToolCallEvent (an ExportedRejection line) on its own: its
// signature is checked where it can hold. The only problems a rejection
// raises are a stored event unlike its line (altered_column), one that is
// not a ToolCallEvent (malformed), and a trusted key's signature that does
// not match bytes stored as received (bad_signature).
func VerifyExport(source string, events [][]byte, keys verify.KeySet, partial, batch bool) *VerifyOutcome {
	signed := make([][]byte, 0, len(events))
	rej := rejections{keys: keys}
	for _, raw := range events {
		if !rej.take(raw) {
			signed = append(signed, raw)
		}
	}
	return exportOutcome(source, verify.VerifyFile(signed, keys, partial, batch), rej.probs, rej.sum)
}

// exportOutcome is the outcome of an export's verification: rep, the
// rejections' problems and their summary.
func exportOutcome(source string, rep verify.Report, rejectionProbs []verify.Problem, sum RejectedSummary) *VerifyOutcome {
	rep.Problems = append(rep.Problems, rejectionProbs...)
	out := NewVerifyOutcome(source, rep)
	out.File = true
	if sum.Total > 0 {
		out.Rejected = &sum
	}
	return out
}

// checkRejection checks one rejected ToolCallEvent, counting it in sum;
// it returns the problem it shows, if any.
func checkRejection(x *ExportedRejection, keys verify.KeySet, sum *RejectedSummary) *verify.Problem {
	problem := func(kind, format string, a ...any) *verify.Problem {
		return &verify.Problem{Kind: kind, ReceiptID: x.ID, Record: RecordRejectedToolCall, Detail: fmt.Sprintf(format, a...)}
	}
	ev, err := verify.VerifyEvent([]byte(x.CloudEvent), keys)
	switch {
	case ev != nil && ev.Type != schemas.TypeToolCall:
		return problem(verify.ProblemMalformed, "holds a %q event, not a ToolCallEvent", ev.Type)
	case ev != nil && ev.ID != x.ID:
		return problem(ProblemAlteredColumn, "its stored event has id %s", ev.ID)
	case err == nil:
		sum.Signed++
	case x.PayloadsWithheld:
		sum.Withheld++
	case errors.Is(err, verify.ErrBadSignature):
		return problem(verify.ProblemBadSignature, "stored as received, and its signature by %s does not match it", ev.KID)
	default:
		sum.Unsigned++
	}
	return nil
}

// summary is the OK line's account of the rejected ToolCallEvents.
func (s *RejectedSummary) summary() string {
	return fmt.Sprintf("; %d rejected ToolCallEvents (refused by the flight recorder, in no chain): %d signed by a trusted key, "+
		"%d stored without the payloads their signature covers (not checkable from the file; --log-url finds them in the log), "+
		"%d not signed by a trusted key", s.Total, s.Signed, s.Withheld, s.Unsigned)
}
