package query

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// ReceiptRow is one row of the receipts table. Every column except
// InsertedAt is derived from CloudEvent, the exact signed JSON, by
// ReceiptRowFromEvent; the columns exist so auditors can query without
// parsing JSON, and CompareColumns tells when they were altered.
type ReceiptRow struct {
	ReceiptID      string    // CloudEvent id
	Kind           string    // decision | effect | control, from type dev.talos.receipt.<kind>.v1
	Phase          string    // data.phase
	Time           time.Time // CloudEvent time, truncated to the second (DateTime)
	TimeMS         uint64    // CloudEvent time, unix milliseconds
	ToolCallID     string
	TraceID        string
	SessionID      string
	EPID           string
	ServerID       string
	ToolName       string
	ToolClass      string
	Decision       string
	ReasonCodes    []string
	AgentID        string
	RequestHash    string
	EnvelopeHash   string
	RegistryDigest string
	ChainID        string
	ChainSeq       uint64
	PrevHash       string
	ReceiptHash    string // hex sha256 of JCS(event without data.signature)
	SignerKID      string // data.signature.kid
	CloudEvent     string // the exact signed JSON
	// CapabilityHash and CapabilityIDs are seed 002's capability_hash and
	// the verified chain's capability ids (root first), from data.
	CapabilityHash string
	CapabilityIDs  []string
	InsertedAt     time.Time
}

// receiptInsertColumns are the columns InsertReceipts writes, in the order of
// ReceiptRow.insertValues. inserted_at is left to its DEFAULT.
var receiptInsertColumns = []string{
	"receipt_id", "kind", "phase", "time", "time_ms", "tool_call_id", "trace_id", "session_id",
	"ep_id", "server_id", "tool_name", "tool_class", "decision", "reason_codes", "agent_id",
	"request_hash", "envelope_hash", "registry_digest", "chain_id", "chain_seq", "prev_hash",
	"receipt_hash", "signer_kid", "cloudevent", "capability_hash", "capability_ids",
}

func (r *ReceiptRow) insertValues() []any {
	return []any{
		r.ReceiptID, r.Kind, r.Phase, r.Time.UTC(), r.TimeMS, r.ToolCallID, r.TraceID, r.SessionID,
		r.EPID, r.ServerID, r.ToolName, r.ToolClass, r.Decision, nonNil(r.ReasonCodes), r.AgentID,
		r.RequestHash, r.EnvelopeHash, r.RegistryDigest, r.ChainID, r.ChainSeq, r.PrevHash,
		r.ReceiptHash, r.SignerKID, r.CloudEvent, r.CapabilityHash, nonNil(r.CapabilityIDs),
	}
}

// scanTargets matches receiptInsertColumns plus inserted_at.
func (r *ReceiptRow) scanTargets() []any {
	return []any{
		&r.ReceiptID, &r.Kind, &r.Phase, &r.Time, &r.TimeMS, &r.ToolCallID, &r.TraceID, &r.SessionID,
		&r.EPID, &r.ServerID, &r.ToolName, &r.ToolClass, &r.Decision, &r.ReasonCodes, &r.AgentID,
		&r.RequestHash, &r.EnvelopeHash, &r.RegistryDigest, &r.ChainID, &r.ChainSeq, &r.PrevHash,
		&r.ReceiptHash, &r.SignerKID, &r.CloudEvent, &r.CapabilityHash, &r.CapabilityIDs, &r.InsertedAt,
	}
}

// ErrNotReceipt is returned by ReceiptRowFromEvent for a CloudEvent that is
// not a Talos receipt (wrong type, or no id).
var ErrNotReceipt = errors.New("not a Talos receipt CloudEvent")

const receiptTypePrefix, receiptTypeSuffix = "dev.talos.receipt.", ".v1"

// ReceiptRowFromEvent derives a receipts row from a signed receipt
// CloudEvent. It checks the JSON is well formed but not the signature or
// the chain: that is the verifier's job.
//
// Cost: one struct parse and one sha256; events in canonical form (as
// published) are hashed without re-encoding. Duplicate keys and
// non-canonical forms are the verifier's to report, not the projection's.
func ReceiptRowFromEvent(raw []byte) (ReceiptRow, error) {
	row, _, err := receiptRowFromEvent(raw)
	return row, err
}

// receiptRowFromEvent is ReceiptRowFromEvent that also returns the parsed
// receipt data, for projections that need more of it (control receipts).
func receiptRowFromEvent(raw []byte) (ReceiptRow, *schemas.Receipt, error) {
	var ev struct {
		ID   string           `json:"id"`
		Type string           `json:"type"`
		Time string           `json:"time"`
		Data *schemas.Receipt `json:"data"`
	}
	if err := json.Unmarshal(raw, &ev); err != nil {
		return ReceiptRow{}, nil, fmt.Errorf("query: receipt: %w", err)
	}
	rest, okPrefix := strings.CutPrefix(ev.Type, receiptTypePrefix)
	kind, okSuffix := strings.CutSuffix(rest, receiptTypeSuffix)
	if !okPrefix || !okSuffix || kind == "" || strings.Contains(kind, ".") {
		return ReceiptRow{}, nil, fmt.Errorf("query: type %q: %w", ev.Type, ErrNotReceipt)
	}
	if ev.ID == "" {
		return ReceiptRow{}, nil, fmt.Errorf("query: receipt without id: %w", ErrNotReceipt)
	}
	t, err := time.Parse(time.RFC3339Nano, ev.Time)
	if err != nil {
		return ReceiptRow{}, nil, fmt.Errorf("query: receipt %s time: %w", ev.ID, err)
	}
	if t.Before(time.Unix(0, 0)) {
		return ReceiptRow{}, nil, fmt.Errorf("query: receipt %s time %s is before 1970", ev.ID, ev.Time)
	}
	if ev.Data == nil {
		return ReceiptRow{}, nil, fmt.Errorf("query: receipt %s has no data", ev.ID)
	}
	rec := *ev.Data
	hash, err := receipts.ReceiptHash(raw)
	if err != nil {
		return ReceiptRow{}, nil, fmt.Errorf("query: receipt %s hash: %w", ev.ID, err)
	}
	row := ReceiptRow{
		ReceiptID:      ev.ID,
		Kind:           kind,
		Phase:          rec.Phase,
		Time:           t.UTC().Truncate(time.Second),
		TimeMS:         uint64(t.UnixMilli()),
		ToolCallID:     rec.ToolCallID,
		TraceID:        rec.TraceID,
		SessionID:      rec.SessionID,
		EPID:           rec.EPID,
		ServerID:       rec.ServerID,
		ToolName:       rec.ToolName,
		ToolClass:      rec.ToolClass,
		Decision:       rec.Decision,
		ReasonCodes:    rec.ReasonCodes,
		AgentID:        rec.AgentID,
		RequestHash:    rec.RequestHash,
		EnvelopeHash:   rec.EnvelopeHash,
		RegistryDigest: rec.RegistryDigest,
		ChainID:        rec.Chain.ChainID,
		ChainSeq:       rec.Chain.Seq,
		PrevHash:       rec.Chain.PrevHash,
		ReceiptHash:    hash,
		CloudEvent:     string(raw),
		CapabilityHash: rec.CapabilityHash,
		CapabilityIDs:  nonNil(rec.CapabilityIDs),
	}
	if row.ReasonCodes == nil {
		row.ReasonCodes = []string{}
	}
	if rec.Signature != nil {
		row.SignerKID = rec.Signature.KID
	}
	return row, &rec, nil
}

// CompareColumns returns the names of the columns whose stored value in row
// differs from fromEvent, the row ReceiptRowFromEvent derives from
// row.CloudEvent; nil means the row agrees with its own signed JSON.
// inserted_at is not compared (the sink sets it). Time is compared at the
// DateTime's one-second precision; nil and empty arrays are equal.
func CompareColumns(row, fromEvent ReceiptRow) []string {
	return diffColumns(receiptInsertColumns, row.insertValues(), fromEvent.insertValues())
}

// diffColumns names the columns whose values differ between two rows
// given as insertValues (names in the same order): times at the DateTime's
// one-second precision, arrays element by element (nil and empty equal),
// everything else by ==. A row type's column list is its insert list, so
// a new column is compared as soon as it is written.
func diffColumns(names []string, a, b []any) []string {
	var diff []string
	for i, name := range names {
		var equal bool
		switch x := a[i].(type) {
		case time.Time:
			y, ok := b[i].(time.Time)
			equal = ok && x.Unix() == y.Unix()
		case []string:
			y, ok := b[i].([]string)
			equal = ok && slices.Equal(x, y)
		default:
			equal = a[i] == b[i]
		}
		if !equal {
			diff = append(diff, name)
		}
	}
	return diff
}

// sameStored reports whether a and b are the same stored row: every column
// equal except inserted_at (a sink redelivery inserts identical rows at
// different times).
func sameStored(a, b *ReceiptRow) bool {
	return len(CompareColumns(*a, *b)) == 0
}
