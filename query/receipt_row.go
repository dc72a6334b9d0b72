package query

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
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
	// CapabilityHash and CapabilityIDs are the capability_hash of CP-SFC and
	// the verified chain's capability ids (root first), from data.
	CapabilityHash string
	CapabilityIDs  []string
	// MCPMethod and ParentToolCallID are data's mcp_method (what ToolName
	// names when the call is not a tools/call) and parent_tool_call_id (the
	// call a server request was made during); "" when absent.
	MCPMethod        string
	ParentToolCallID string
	InsertedAt       time.Time
}

// receiptColumns are the columns a receipt row is inserted with, in order;
// inserted_at is left to its DEFAULT.
var receiptColumns = []insertColumn[ReceiptRow]{
	{name: "receipt_id", str: func(r *ReceiptRow) string { return r.ReceiptID }},
	{name: "kind", str: func(r *ReceiptRow) string { return r.Kind }},
	{name: "phase", str: func(r *ReceiptRow) string { return r.Phase }},
	{name: "time", at: func(r *ReceiptRow) time.Time { return r.Time }},
	{name: "time_ms", u64: func(r *ReceiptRow) uint64 { return r.TimeMS }},
	{name: "tool_call_id", str: func(r *ReceiptRow) string { return r.ToolCallID }},
	{name: "trace_id", str: func(r *ReceiptRow) string { return r.TraceID }},
	{name: "session_id", str: func(r *ReceiptRow) string { return r.SessionID }},
	{name: "ep_id", str: func(r *ReceiptRow) string { return r.EPID }},
	{name: "server_id", str: func(r *ReceiptRow) string { return r.ServerID }},
	{name: "tool_name", str: func(r *ReceiptRow) string { return r.ToolName }},
	{name: "tool_class", str: func(r *ReceiptRow) string { return r.ToolClass }},
	{name: "decision", str: func(r *ReceiptRow) string { return r.Decision }},
	{name: "reason_codes", strs: func(r *ReceiptRow) []string { return r.ReasonCodes }},
	{name: "agent_id", str: func(r *ReceiptRow) string { return r.AgentID }},
	{name: "request_hash", str: func(r *ReceiptRow) string { return r.RequestHash }},
	{name: "envelope_hash", str: func(r *ReceiptRow) string { return r.EnvelopeHash }},
	{name: "registry_digest", str: func(r *ReceiptRow) string { return r.RegistryDigest }},
	{name: "chain_id", str: func(r *ReceiptRow) string { return r.ChainID }},
	{name: "chain_seq", u64: func(r *ReceiptRow) uint64 { return r.ChainSeq }},
	{name: "prev_hash", str: func(r *ReceiptRow) string { return r.PrevHash }},
	{name: "receipt_hash", str: func(r *ReceiptRow) string { return r.ReceiptHash }},
	{name: "signer_kid", str: func(r *ReceiptRow) string { return r.SignerKID }},
	{name: "cloudevent", str: func(r *ReceiptRow) string { return r.CloudEvent }},
	{name: "capability_hash", str: func(r *ReceiptRow) string { return r.CapabilityHash }},
	{name: "capability_ids", strs: func(r *ReceiptRow) []string { return r.CapabilityIDs }},
	{name: "mcp_method", str: func(r *ReceiptRow) string { return r.MCPMethod }},
	{name: "parent_tool_call_id", str: func(r *ReceiptRow) string { return r.ParentToolCallID }},
}

// receiptInsertColumns are the names of receiptColumns.
var receiptInsertColumns = columnNames(receiptColumns)

func (r *ReceiptRow) insertValues() []any { return rowValues(receiptColumns, r) }

// insertReceiptRows writes rows to database.receipts in one INSERT, column
// by column. Inserting a row twice is harmless: readers dedupe by
// receipt_id.
func insertReceiptRows(ctx context.Context, conn driver.Conn, database string, rows []ReceiptRow) error {
	return insertTable(ctx, conn, database, TableReceipts, receiptColumns, rows, func(err error) error {
		return fmt.Errorf("query: insert %d receipts: %w", len(rows), err)
	})
}

// scanTargets matches receiptInsertColumns plus inserted_at.
func (r *ReceiptRow) scanTargets() []any {
	return []any{
		&r.ReceiptID, &r.Kind, &r.Phase, &r.Time, &r.TimeMS, &r.ToolCallID, &r.TraceID, &r.SessionID,
		&r.EPID, &r.ServerID, &r.ToolName, &r.ToolClass, &r.Decision, &r.ReasonCodes, &r.AgentID,
		&r.RequestHash, &r.EnvelopeHash, &r.RegistryDigest, &r.ChainID, &r.ChainSeq, &r.PrevHash,
		&r.ReceiptHash, &r.SignerKID, &r.CloudEvent, &r.CapabilityHash, &r.CapabilityIDs,
		&r.MCPMethod, &r.ParentToolCallID, &r.InsertedAt,
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
// Cost: one pass over the event and one sha256 for a published (RFC 8785)
// event; other forms are decoded with encoding/json, with the same result.
// Duplicate keys and non-canonical forms are the verifier's to report, not
// the projection's.
func ReceiptRowFromEvent(raw []byte) (ReceiptRow, error) {
	row, _, err := receiptRowFromEvent(raw)
	return row, err
}

// receiptRowFromEvent is ReceiptRowFromEvent that also returns data.control,
// which the control_events row of a control receipt needs.
func receiptRowFromEvent(raw []byte) (ReceiptRow, *schemas.ControlRecord, error) {
	return receiptRowOf(raw, string(raw))
}

// receiptRowOf is receiptRowFromEvent with the row's cloudevent given: ce
// holds the bytes of raw, and the row's strings are ce or parts of it.
func receiptRowOf(raw []byte, ce string) (ReceiptRow, *schemas.ControlRecord, error) {
	if row, ok := receiptRowFast(raw, ce); ok {
		return row, nil, nil
	}
	return receiptRowDecoded(raw, ce)
}

// receiptRowDecoded is the general path of receiptRowFromEvent: any JSON
// encoding/json takes, decoded into schemas.Receipt; ce holds the bytes
// of raw.
func receiptRowDecoded(raw []byte, ce string) (ReceiptRow, *schemas.ControlRecord, error) {
	var ev struct {
		ID   string           `json:"id"`
		Type string           `json:"type"`
		Time string           `json:"time"`
		Data *schemas.Receipt `json:"data"`
	}
	if err := json.Unmarshal(raw, &ev); err != nil {
		return ReceiptRow{}, nil, fmt.Errorf("query: receipt: %w", err)
	}
	kind := receiptKind(ev.Type)
	if kind == "" {
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
	hash, err := verify.ReceiptHash(raw)
	if err != nil {
		return ReceiptRow{}, nil, fmt.Errorf("query: receipt %s hash: %w", ev.ID, err)
	}
	return rowOfReceipt(ev.ID, kind, t, &rec, hash, ce), rec.Control, nil
}

// rowOfReceipt is the row of the receipt rec, stored as the CloudEvent ce
// with id, kind and time t and receipt hash hash.
func rowOfReceipt(id, kind string, t time.Time, rec *schemas.Receipt, hash, ce string) ReceiptRow {
	row := ReceiptRow{
		ReceiptID:      id,
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
		CloudEvent:     ce,
		CapabilityHash: rec.CapabilityHash,
		CapabilityIDs:  nonNil(rec.CapabilityIDs),

		MCPMethod:        rec.MCPMethod,
		ParentToolCallID: rec.ParentToolCallID,
	}
	if row.ReasonCodes == nil {
		row.ReasonCodes = []string{}
	}
	if rec.Signature != nil {
		row.SignerKID = rec.Signature.KID
	}
	return row
}

// receiptKind is the kind in a receipt CloudEvent type
// (dev.talos.receipt.<kind>.v1), or "".
func receiptKind(typ string) string {
	rest, okPrefix := strings.CutPrefix(typ, receiptTypePrefix)
	kind, okSuffix := strings.CutSuffix(rest, receiptTypeSuffix)
	if !okPrefix || !okSuffix || strings.Contains(kind, ".") {
		return ""
	}
	return kind
}

// Member names as encoding/json matches them into the structs the general
// path decodes: a key equal to none of them but equal to one under case
// folding would be decoded into that field, so the fast path leaves such
// an event to the general path.
var (
	receiptEventNames = []string{"id", "type", "time", "data"}
	receiptDataNames  = []string{"event_type", "tool", "capability_hash", "request_hash", "response_hash", "agent_id",
		"tool_id", "timestamp", "result_code", "envelope_hash", "tool_call_id", "trace_id", "correlation_id",
		"session_id", "ep_id", "server_id", "tool_name", "phase", "mode", "decision", "reason_codes", "tool_class",
		"registry_digest", "document_hashes", "batch_total_bytes", "content_hash_alg", "effect", "capability_ids",
		"idempotent_of", "control_seq", "control", "chain", "signature", "token_handling", "upstream_sandbox", "mcp_method", "parent_tool_call_id"}
	chainNames     = []string{"chain_id", "seq", "prev_hash"}
	signatureNames = []string{"alg", "kid", "sig"}
	// Members whose value the row does not use but whose type the general
	// path checks.
	documentHashFields = []checkedField{{"pointer", kindString}, {"hash", kindString}, {"size_bytes", kindInt}}
	effectFields       = []checkedField{{"effect_id", kindString}, {"tool_call_id", kindString},
		{"document_hashes", kindDocumentHashes}, {"batch_total_bytes", kindInt}, {"content_hash_alg", kindString}}
	idempotentOfFields  = []checkedField{{"tool_call_id", kindString}, {"receipt_id", kindString}}
	tokenHandlingFields = []checkedField{{"mode", kindString}, {"audience", kindString},
		{"passthrough_detected", kindBool}, {"error", kindString}}
	upstreamSandboxFields = []checkedField{{"sandboxed", kindBool}, {"network", kindString}, {"allowlist_sha256", kindString}}
)

// checkedField is a member a fast path type-checks and discards.
type checkedField struct {
	name string
	kind valueKind
}

type valueKind uint8

const (
	kindString valueKind = iota
	kindInt
	kindBool
	kindDocumentHashes
)

// check reads a value of kind k, or null (what encoding/json decodes into
// a field of that kind without error).
func (r *jsonReader) check(k valueKind) {
	if r.null() {
		return
	}
	switch k {
	case kindString:
		r.rawString()
	case kindInt:
		r.readInt()
	case kindBool:
		r.boolean()
	case kindDocumentHashes:
		if !r.array() {
			return
		}
		for n := 0; r.elem(&n); {
			r.checkObject(documentHashFields)
		}
	}
}

// checkObject reads null or an object whose members named in fields have
// their kind; other members are skipped.
func (r *jsonReader) checkObject(fields []checkedField) {
	if r.null() || !r.object() {
		return
	}
	var it objectIter
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		known := false
		for _, f := range fields {
			if f.name == key {
				r.check(f.kind)
				known = true
				break
			}
		}
		if known {
			continue
		}
		for _, f := range fields {
			if strings.EqualFold(f.name, key) {
				r.fail()
			}
		}
		r.skip()
	}
}

// optStr reads a string, or null as "".
func (r *jsonReader) optStr() string {
	if r.null() {
		return ""
	}
	return r.str()
}

// receiptRowFast is receiptRowFromEvent for an event the jsonReader takes
// whose every member has the type schemas.Receipt gives it and whose data
// has no control member; ok is false for anything else, and the caller
// then takes the general path. raw and ce hold the same bytes.
func receiptRowFast(raw []byte, ce string) (ReceiptRow, bool) {
	r := jsonReader{s: ce}
	row := ReceiptRow{CloudEvent: ce}
	var (
		typ, tm     string
		sig         = [2]int{-1, -1}
		buf         []string
		codes, caps [2]int
		it          objectIter
		data        bool
	)
	if !r.object() {
		return row, false
	}
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		switch key {
		case "data":
			if r.peek() != '{' {
				return row, false
			}
			data = true
			buf, codes, caps, sig = r.receiptData(&row)
		case "id":
			row.ReceiptID = r.optStr()
		case "time":
			tm = r.optStr()
		case "type":
			typ = r.optStr()
		default:
			if foldsToAny(key, receiptEventNames) {
				return row, false
			}
			r.skip()
		}
	}
	if !r.done() || !data || sig[0] < 0 {
		return row, false
	}
	if row.Kind = receiptKind(typ); row.Kind == "" || row.ReceiptID == "" {
		return row, false
	}
	t, ok := parseEventTime(tm)
	if !ok {
		return row, false
	}
	row.Time, row.TimeMS = t.Truncate(time.Second), uint64(t.UnixMilli())
	row.ReceiptHash = hashWithout(raw, sig[0], sig[1])
	row.ReasonCodes, row.CapabilityIDs = part(buf, codes), part(buf, caps)
	return row, true
}

// receiptData reads the data object of a receipt into row. It returns the
// backing array of the row's string arrays with their bounds, and the
// offsets of the data.signature member ([-1 -1] when there is none).
func (r *jsonReader) receiptData(row *ReceiptRow) (buf []string, codes, caps, sig [2]int) {
	sig = [2]int{-1, -1}
	r.object()
	var it objectIter
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		switch key {
		case "agent_id":
			row.AgentID = r.optStr()
		case "batch_total_bytes":
			r.check(kindInt)
		case "capability_hash":
			row.CapabilityHash = r.optStr()
		case "capability_ids":
			if !r.null() {
				buf, caps = r.readStrings(buf)
			}
		case "chain":
			r.receiptChain(row)
		case "content_hash_alg", "correlation_id", "event_type", "mode", "response_hash", "result_code", "timestamp", "tool", "tool_id":
			r.check(kindString)
		case "control":
			r.fail() // control receipts take the general path
		case "control_seq":
			if !r.null() {
				r.readUint()
			}
		case "decision":
			row.Decision = r.optStr()
		case "document_hashes":
			r.check(kindDocumentHashes)
		case "effect":
			r.checkObject(effectFields)
		case "envelope_hash":
			row.EnvelopeHash = r.optStr()
		case "ep_id":
			row.EPID = r.optStr()
		case "idempotent_of":
			r.checkObject(idempotentOfFields)
		case "phase":
			row.Phase = r.optStr()
		case "reason_codes":
			if !r.null() {
				buf, codes = r.readStrings(buf)
			}
		case "registry_digest":
			row.RegistryDigest = r.optStr()
		case "request_hash":
			row.RequestHash = r.optStr()
		case "server_id":
			row.ServerID = r.optStr()
		case "session_id":
			row.SessionID = r.optStr()
		case "signature":
			start := it.keyStart
			r.receiptSignature(row)
			sig = [2]int{start, r.i}
		case "tool_call_id":
			row.ToolCallID = r.optStr()
		case "tool_class":
			row.ToolClass = r.optStr()
		case "tool_name":
			row.ToolName = r.optStr()
		case "token_handling":
			r.checkObject(tokenHandlingFields)
		case "upstream_sandbox":
			r.checkObject(upstreamSandboxFields)
		case "mcp_method":
			row.MCPMethod = r.optStr()
		case "parent_tool_call_id":
			row.ParentToolCallID = r.optStr()
		case "trace_id":
			row.TraceID = r.optStr()
		default:
			if foldsToAny(key, receiptDataNames) {
				r.fail()
			}
			r.skip()
		}
	}
	return buf, codes, caps, sig
}

// receiptChain reads null or the chain object of a receipt's data into row.
func (r *jsonReader) receiptChain(row *ReceiptRow) {
	if r.null() || !r.object() {
		return
	}
	var it objectIter
	for k, ok := r.next(&it); ok; k, ok = r.next(&it) {
		switch k {
		case "chain_id":
			row.ChainID = r.optStr()
		case "prev_hash":
			row.PrevHash = r.optStr()
		case "seq":
			if !r.null() {
				row.ChainSeq = r.readUint()
			}
		default:
			if foldsToAny(k, chainNames) {
				r.fail()
			}
			r.skip()
		}
	}
}

// receiptSignature reads null or the signature object of a receipt's data
// into row.
func (r *jsonReader) receiptSignature(row *ReceiptRow) {
	if r.null() || !r.object() {
		return
	}
	var it objectIter
	for k, ok := r.next(&it); ok; k, ok = r.next(&it) {
		switch k {
		case "kid":
			row.SignerKID = r.optStr()
		case "alg", "sig":
			r.check(kindString)
		default:
			if foldsToAny(k, signatureNames) {
				r.fail()
			}
			r.skip()
		}
	}
}

// hashWithout is the receipt hash of a canonical event whose data.signature
// member spans raw[start:end]: hex sha256 of raw without that member and
// one comma next to it (verify.ReceiptHash of the same bytes).
func hashWithout(raw []byte, start, end int) string {
	start, end = jsonkit.Member{Start: start, End: end}.Without(raw)
	h := sha256Pool.Get().(*pooledSHA256)
	h.h.Reset()
	h.h.Write(raw[:start])
	h.h.Write(raw[end:])
	sum := h.h.Sum(h.sum[:0])
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum)
	sha256Pool.Put(h)
	return string(hx[:])
}

// pooledSHA256 is a sha256 state with room for its sum, reused across
// receipts so that hashing one allocates nothing.
type pooledSHA256 struct {
	h   hash.Hash
	sum [sha256.Size]byte
}

var sha256Pool = sync.Pool{New: func() any { return &pooledSHA256{h: sha256.New()} }}

// parseEventTime parses the time layout Talos publishes, RFC 3339 in UTC
// with 1 to 9 fraction digits (2006-01-02T15:04:05.000Z), at or after
// 1970; ok is false for anything else, including times time.Parse reads
// but this does not. The result equals time.Parse(time.RFC3339Nano, s).UTC().
func parseEventTime(s string) (time.Time, bool) {
	if len(s) < 20 || len(s) > 30 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[len(s)-1] != 'Z' {
		return time.Time{}, false
	}
	num := func(a, b int) int {
		v := 0
		for i := a; i < b; i++ {
			c := s[i]
			if c < '0' || c > '9' {
				return -1
			}
			v = v*10 + int(c-'0')
		}
		return v
	}
	year, month, day := num(0, 4), num(5, 7), num(8, 10)
	hour, minute, sec := num(11, 13), num(14, 16), num(17, 19)
	nsec := 0
	if frac := s[19 : len(s)-1]; frac != "" {
		if len(frac) < 2 || frac[0] != '.' {
			return time.Time{}, false
		}
		if nsec = num(20, len(s)-1); nsec < 0 {
			return time.Time{}, false
		}
		for i := len(frac) - 1; i < 9; i++ {
			nsec *= 10
		}
	}
	if year < 1970 || month < 1 || month > 12 || day < 1 || hour < 0 || hour > 23 || minute < 0 || minute > 59 || sec < 0 || sec > 59 {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if t.Day() != day { // February 30th and the like
		return time.Time{}, false
	}
	return t, true
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
