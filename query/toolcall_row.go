package query

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/gowebpki/jcs"

	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// ToolCallRow is one row of tool_calls: a ToolCallEvent (UTS FR-EVT-007)
// flattened for auditors. Every column except InsertedAt is derived
// from CloudEvent, the exact signed JSON, by ToolCallRowFromEvent, and
// CompareToolCallColumns tells when a stored row was altered.
type ToolCallRow struct {
	EventID    string    // CloudEvent id
	Time       time.Time // CloudEvent time, truncated to the second
	TimeMS     uint64    // CloudEvent time, unix milliseconds
	ToolCallID string
	TraceID    string
	SessionID  string
	EPID       string
	ServerID   string
	ToolName   string
	// MCPMethod and ParentToolCallID are data's mcp_method (what ToolName
	// names when the call is not a tools/call) and parent_tool_call_id (the
	// call a server request was made during); "" when absent.
	MCPMethod        string
	ParentToolCallID string
	ToolID           string
	ToolVersion      string
	Transport        string
	SideEffect       string
	OK               bool
	ArgsHash         string
	ResultHash       string
	ArgsRef          string
	ResultRef        string
	ErrorCode        string
	StartedAt        time.Time // timing.started_at, truncated to the second
	StartedAtMS      uint64
	EndedAt          time.Time // timing.ended_at, truncated to the second
	EndedAtMS        uint64
	DurationMS       uint64

	Phase          string
	Decision       string
	ReasonCodes    []string
	ReceiptID      string
	Idempotency    string
	IdempotencyKey string
	ActorKind      string
	AgentID        string
	ModelID        string
	ErrorKind      string
	ErrorMessage   string
	ErrorRetryable bool // error.retryable; false when absent
	CapabilityIDs  []string
	ParentSpanID   string
	ResourcesFiles []string
	ResourcesURLs  []string
	Flags          []string
	// Redactions as parallel arrays: element i of each is one redaction.
	RedactionPointers   []string
	RedactionRules      []string
	RedactionPseudonyms []string
	SignerKID           string // data.signature.kid

	CloudEvent string // the exact signed JSON
	InsertedAt time.Time
}

// toolCallColumns are the columns a tool_calls row is inserted with, in
// the order of toolCallColumnsSQL; inserted_at is left to its DEFAULT.
var toolCallColumns = []insertColumn[ToolCallRow]{
	{name: "event_id", str: func(r *ToolCallRow) string { return r.EventID }},
	{name: "time", at: func(r *ToolCallRow) time.Time { return r.Time }},
	{name: "time_ms", u64: func(r *ToolCallRow) uint64 { return r.TimeMS }},
	{name: "tool_call_id", str: func(r *ToolCallRow) string { return r.ToolCallID }},
	{name: "trace_id", str: func(r *ToolCallRow) string { return r.TraceID }},
	{name: "session_id", str: func(r *ToolCallRow) string { return r.SessionID }},
	{name: "ep_id", str: func(r *ToolCallRow) string { return r.EPID }},
	{name: "server_id", str: func(r *ToolCallRow) string { return r.ServerID }},
	{name: "tool_name", str: func(r *ToolCallRow) string { return r.ToolName }},
	{name: "mcp_method", str: func(r *ToolCallRow) string { return r.MCPMethod }},
	{name: "parent_tool_call_id", str: func(r *ToolCallRow) string { return r.ParentToolCallID }},
	{name: "tool_id", str: func(r *ToolCallRow) string { return r.ToolID }},
	{name: "tool_version", str: func(r *ToolCallRow) string { return r.ToolVersion }},
	{name: "transport", str: func(r *ToolCallRow) string { return r.Transport }},
	{name: "side_effect", str: func(r *ToolCallRow) string { return r.SideEffect }},
	{name: "ok", u8: func(r *ToolCallRow) uint8 { return boolByte(r.OK) }},
	{name: "args_hash", str: func(r *ToolCallRow) string { return r.ArgsHash }},
	{name: "result_hash", str: func(r *ToolCallRow) string { return r.ResultHash }},
	{name: "args_ref", str: func(r *ToolCallRow) string { return r.ArgsRef }},
	{name: "result_ref", str: func(r *ToolCallRow) string { return r.ResultRef }},
	{name: "error_code", str: func(r *ToolCallRow) string { return r.ErrorCode }},
	{name: "started_at", at: func(r *ToolCallRow) time.Time { return r.StartedAt }},
	{name: "started_at_ms", u64: func(r *ToolCallRow) uint64 { return r.StartedAtMS }},
	{name: "ended_at", at: func(r *ToolCallRow) time.Time { return r.EndedAt }},
	{name: "ended_at_ms", u64: func(r *ToolCallRow) uint64 { return r.EndedAtMS }},
	{name: "duration_ms", u64: func(r *ToolCallRow) uint64 { return r.DurationMS }},
	{name: "phase", str: func(r *ToolCallRow) string { return r.Phase }},
	{name: "decision", str: func(r *ToolCallRow) string { return r.Decision }},
	{name: "reason_codes", strs: func(r *ToolCallRow) []string { return r.ReasonCodes }},
	{name: "receipt_id", str: func(r *ToolCallRow) string { return r.ReceiptID }},
	{name: "idempotency", str: func(r *ToolCallRow) string { return r.Idempotency }},
	{name: "idempotency_key", str: func(r *ToolCallRow) string { return r.IdempotencyKey }},
	{name: "actor_kind", str: func(r *ToolCallRow) string { return r.ActorKind }},
	{name: "agent_id", str: func(r *ToolCallRow) string { return r.AgentID }},
	{name: "model_id", str: func(r *ToolCallRow) string { return r.ModelID }},
	{name: "error_kind", str: func(r *ToolCallRow) string { return r.ErrorKind }},
	{name: "error_message", str: func(r *ToolCallRow) string { return r.ErrorMessage }},
	{name: "error_retryable", u8: func(r *ToolCallRow) uint8 { return boolByte(r.ErrorRetryable) }},
	{name: "capability_ids", strs: func(r *ToolCallRow) []string { return r.CapabilityIDs }},
	{name: "parent_span_id", str: func(r *ToolCallRow) string { return r.ParentSpanID }},
	{name: "resources_files", strs: func(r *ToolCallRow) []string { return r.ResourcesFiles }},
	{name: "resources_urls", strs: func(r *ToolCallRow) []string { return r.ResourcesURLs }},
	{name: "flags", strs: func(r *ToolCallRow) []string { return r.Flags }},
	{name: "redaction_pointers", strs: func(r *ToolCallRow) []string { return r.RedactionPointers }},
	{name: "redaction_rules", strs: func(r *ToolCallRow) []string { return r.RedactionRules }},
	{name: "redaction_pseudonyms", strs: func(r *ToolCallRow) []string { return r.RedactionPseudonyms }},
	{name: "signer_kid", str: func(r *ToolCallRow) string { return r.SignerKID }},
	{name: "cloudevent", str: func(r *ToolCallRow) string { return r.CloudEvent }},
}

// toolCallInsertColumns are the names of toolCallColumns.
var toolCallInsertColumns = columnNames(toolCallColumns)

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (r *ToolCallRow) insertValues() []any { return rowValues(toolCallColumns, r) }

// scan reads one row selected with toolCallColumnsSQL.
func (r *ToolCallRow) scan(rows driver.Rows) error {
	var ok, retryable uint8
	err := rows.Scan(
		&r.EventID, &r.Time, &r.TimeMS, &r.ToolCallID, &r.TraceID, &r.SessionID, &r.EPID, &r.ServerID, &r.ToolName,
		&r.MCPMethod, &r.ParentToolCallID, &r.ToolID, &r.ToolVersion, &r.Transport, &r.SideEffect, &ok, &r.ArgsHash, &r.ResultHash, &r.ArgsRef,
		&r.ResultRef, &r.ErrorCode, &r.StartedAt, &r.StartedAtMS, &r.EndedAt, &r.EndedAtMS, &r.DurationMS,
		&r.Phase, &r.Decision, &r.ReasonCodes, &r.ReceiptID, &r.Idempotency, &r.IdempotencyKey, &r.ActorKind,
		&r.AgentID, &r.ModelID, &r.ErrorKind, &r.ErrorMessage, &retryable, &r.CapabilityIDs,
		&r.ParentSpanID, &r.ResourcesFiles, &r.ResourcesURLs, &r.Flags, &r.RedactionPointers, &r.RedactionRules,
		&r.RedactionPseudonyms, &r.SignerKID, &r.CloudEvent, &r.InsertedAt,
	)
	r.OK, r.ErrorRetryable = ok == 1, retryable == 1
	r.Time, r.StartedAt, r.EndedAt, r.InsertedAt = r.Time.UTC(), r.StartedAt.UTC(), r.EndedAt.UTC(), r.InsertedAt.UTC()
	return err
}

// Artifact is a redacted payload, stored content-addressed in artifacts:
// Ref is "sha256:" + hex(sha256(Content)), and Content is the RFC 8785 JSON
// whose sha256 the event carries as args_hash or result_hash.
type Artifact struct {
	Ref         string
	ContentType string // "application/json"
	Content     []byte
}

// ArtifactContentType is the content type of every artifact the flight
// recorder stores (redacted JSON payloads).
const ArtifactContentType = "application/json"

// ErrNotToolCallEvent is returned (wrapped) by ToolCallRowFromEvent for a
// record that is not a ToolCallEvent CloudEvent at all: not a JSON object,
// or another type. Such a record is a dead letter, not a rejection.
var ErrNotToolCallEvent = errors.New("not a dev.talos.toolcall.v1 CloudEvent")

// RejectedToolCall is the error of ToolCallRowFromEvent for a ToolCallEvent
// the flight recorder refuses (UTS FR-EVT-007): it fails its schema (Missing
// names which of trace_id, tool_call_id, tool_id, tool_version are absent
// or empty), or a payload does not match its hash. Reason names fields and
// schema keywords only, never a value.
type RejectedToolCall struct {
	Missing []string
	Reason  string
}

func (e *RejectedToolCall) Error() string {
	if len(e.Missing) > 0 {
		return "query: toolcall event rejected: missing " + strings.Join(e.Missing, ", ") + ": " + e.Reason
	}
	return "query: toolcall event rejected: " + e.Reason
}

// RequiredToolCallFields are the fields without which the flight recorder
// MUST reject a ToolCallEvent (UTS FR-EVT-007).
var RequiredToolCallFields = []string{"trace_id", "tool_call_id", "tool_id", "tool_version"}

// missingRequired names the RequiredToolCallFields that data (the event's
// data member) lacks, has as null, as a non-string or as "".
func missingRequired(data json.RawMessage) []string {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(data, &m) // not an object: every field is missing
	var out []string
	for _, f := range RequiredToolCallFields {
		var s string
		if err := json.Unmarshal(m[f], &s); err != nil || s == "" {
			out = append(out, f)
		}
	}
	return out
}

// toolCallEnvelope is the part of a CloudEvent that failed ToolCallEvent
// validation read to tell a rejection from a dead letter.
type toolCallEnvelope struct {
	ID   string          `json:"id"`
	Type string          `json:"type"`
	Time string          `json:"time"`
	Data json.RawMessage `json:"data"`
}

func parseToolCallEnvelope(raw []byte) (toolCallEnvelope, error) {
	var env toolCallEnvelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return env, fmt.Errorf("query: toolcall event: %w", ErrNotToolCallEvent)
	}
	if env.Type != schemas.TypeToolCall {
		return env, fmt.Errorf("query: type %q: %w", env.Type, ErrNotToolCallEvent)
	}
	return env, nil
}

// ToolCallRowFromEvent derives the tool_calls row of a signed ToolCallEvent
// CloudEvent and the artifacts of its redacted payloads. It validates the
// event against toolcall_event.schema.json and checks that each payload's
// sha256 is its args_hash / result_hash and that args_ref / result_ref name
// it; it does not check the signature (VerifyDatabase does).
//
// The error is a *RejectedToolCall for an event the recorder refuses (keep
// it in tool_call_rejections), or wraps ErrNotToolCallEvent for a record
// that is not a ToolCallEvent (a dead letter).
//
// A published event (RFC 8785) that passes is read once: the schema's
// checks, the row and the payload hashes come from one pass over it
// (toolCallRowFast). Anything else, including every event that fails, is
// validated with the schema and decoded by the general path, which words
// the rejection.
func ToolCallRowFromEvent(raw []byte) (ToolCallRow, []Artifact, error) {
	row, arts, err := toolCallRowOf(raw, string(raw), nil)
	for i := range arts {
		arts[i].Content = slices.Clone(arts[i].Content) // their own copy, not part of raw
	}
	return row, arts, err
}

// toolCallRowOf is ToolCallRowFromEvent with the row's cloudevent given
// (ce holds the bytes of raw; the row's strings are ce or parts of it),
// appending the artifacts to arts (returned unchanged on error). An
// artifact's Content may be part of raw.
func toolCallRowOf(raw []byte, ce string, arts []Artifact) (ToolCallRow, []Artifact, error) {
	if row, out, ok := toolCallRowFast(raw, ce, arts); ok {
		return row, out, nil
	}
	row, own, err := toolCallRowValidated(raw, ce)
	if err != nil {
		return row, arts, err
	}
	if arts == nil {
		return row, own, nil
	}
	return row, append(arts, own...), nil
}

// toolCallRowValidated is the general path of ToolCallRowFromEvent: the
// schema validator, then encoding/json; ce holds the bytes of raw.
func toolCallRowValidated(raw []byte, ce string) (ToolCallRow, []Artifact, error) {
	// Validation first: on the sink's path nearly every event passes, and
	// the schema pins its type, so the envelope is read on its own only to
	// tell a refused ToolCallEvent from something else.
	if verr := schemas.ValidateToolCallEvent(raw); verr != nil {
		env, err := parseToolCallEnvelope(raw)
		if err != nil {
			return ToolCallRow{}, nil, err
		}
		return ToolCallRow{}, nil, &RejectedToolCall{Missing: missingRequired(env.Data), Reason: verr.Error()}
	}
	reject := func(format string, a ...any) (ToolCallRow, []Artifact, error) {
		return ToolCallRow{}, nil, &RejectedToolCall{Reason: fmt.Sprintf(format, a...)}
	}
	var env struct {
		ID   string                `json:"id"`
		Time string                `json:"time"`
		Data schemas.ToolCallEvent `json:"data"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return reject("data does not decode as a ToolCallEvent")
	}
	ev := &env.Data
	times := [3]time.Time{}
	for i, s := range []struct{ name, value string }{
		{"time", env.Time}, {"timing.started_at", ev.Timing.StartedAt}, {"timing.ended_at", ev.Timing.EndedAt},
	} {
		t, err := time.Parse(time.RFC3339Nano, s.value)
		if err != nil {
			return reject("%s is not RFC 3339", s.name)
		}
		if t.Before(time.Unix(0, 0)) {
			return reject("%s is before 1970", s.name)
		}
		times[i] = t.UTC()
	}

	var arts []Artifact
	if ev.Payloads != nil {
		for _, p := range []struct {
			name, hash, ref string
			content         json.RawMessage
		}{
			{"args", ev.ArgsHash, ev.ArgsRef, json.RawMessage(ev.Payloads.Args)},
			{"result", ev.ResultHash, ev.ResultRef, json.RawMessage(ev.Payloads.Result)},
		} {
			if p.content == nil {
				continue
			}
			a, reason := artifactFor(p.content, p.hash)
			if reason != "" {
				return reject("%s_hash does not match payload: %s", p.name, reason)
			}
			if p.ref != a.Ref {
				return reject("%s_ref does not name the payload", p.name)
			}
			arts = append(arts, a)
		}
	}
	for _, p := range []struct{ name, hash, ref string }{{"args", ev.ArgsHash, ev.ArgsRef}, {"result", ev.ResultHash, ev.ResultRef}} {
		if p.ref != "" && p.ref != "sha256:"+p.hash {
			return reject("%s_ref is not sha256:%s_hash", p.name, p.name)
		}
	}

	return toolCallRowOfEvent(env.ID, ce, times, ev), arts, nil
}

// toolCallRowOfEvent is the row of a decoded ToolCallEvent whose
// cloudevent is ce, with id and the times (time, timing.started_at,
// timing.ended_at) of the event.
func toolCallRowOfEvent(id, ce string, times [3]time.Time, ev *schemas.ToolCallEvent) ToolCallRow {
	row := ToolCallRow{
		EventID: id, Time: times[0].Truncate(time.Second), TimeMS: uint64(times[0].UnixMilli()),
		ToolCallID: ev.ToolCallID, TraceID: ev.TraceID, SessionID: ev.SessionID, EPID: ev.EPID, ServerID: ev.ServerID,
		ToolName: ev.ToolName, MCPMethod: ev.MCPMethod, ParentToolCallID: ev.ParentToolCallID, ToolID: ev.ToolID, ToolVersion: ev.ToolVersion, Transport: ev.Transport,
		SideEffect: ev.SideEffect, OK: ev.OK, ArgsHash: ev.ArgsHash, ResultHash: ev.ResultHash, ArgsRef: ev.ArgsRef,
		ResultRef: ev.ResultRef,
		StartedAt: times[1].Truncate(time.Second), StartedAtMS: uint64(times[1].UnixMilli()),
		EndedAt: times[2].Truncate(time.Second), EndedAtMS: uint64(times[2].UnixMilli()),
		DurationMS: uint64(ev.Timing.DurationMS),
		Phase:      ev.Phase, Decision: ev.Decision, ReasonCodes: nonNil(ev.ReasonCodes), ReceiptID: ev.ReceiptID,
		Idempotency: ev.Idempotency, IdempotencyKey: ev.IdempotencyKey,
		ActorKind: ev.Actor.Kind, AgentID: ev.Actor.AgentID, ModelID: ev.Actor.ModelID,
		CapabilityIDs: nonNil(ev.CapabilityIDs), ParentSpanID: ev.ParentSpanID, Flags: nonNil(ev.Flags),
		ResourcesFiles: []string{}, ResourcesURLs: []string{},
		RedactionPointers: make([]string, len(ev.Redactions)), RedactionRules: make([]string, len(ev.Redactions)),
		RedactionPseudonyms: make([]string, len(ev.Redactions)),
		CloudEvent:          ce,
	}
	if e := ev.Error; e != nil {
		row.ErrorCode, row.ErrorKind, row.ErrorMessage = e.Code, e.Kind, e.Message
		row.ErrorRetryable = e.Retryable != nil && *e.Retryable
	}
	if r := ev.Resources; r != nil {
		row.ResourcesFiles, row.ResourcesURLs = nonNil(r.Files), nonNil(r.URLs)
	}
	for i, r := range ev.Redactions {
		row.RedactionPointers[i], row.RedactionRules[i], row.RedactionPseudonyms[i] = r.Pointer, r.Rule, r.Pseudonym
	}
	if ev.Signature != nil {
		row.SignerKID = ev.Signature.KID
	}
	return row
}

// artifactFor returns the artifact of a payload whose sha256 must be hash.
// Payloads are published in RFC 8785 form; one that is not (re-encoded on
// the way) is canonicalized, and must then match. reason is "" on success.
func artifactFor(content json.RawMessage, hash string) (Artifact, string) {
	if hash == "" {
		return Artifact{}, "payload without a hash"
	}
	sum := sha256.Sum256(content)
	if hex.EncodeToString(sum[:]) != hash {
		canon, err := jcs.Transform(content)
		if err != nil {
			return Artifact{}, "payload is not canonicalizable JSON"
		}
		if sum = sha256.Sum256(canon); hex.EncodeToString(sum[:]) != hash {
			return Artifact{}, "sha256 differs"
		}
		content = canon
	}
	return Artifact{Ref: "sha256:" + hash, ContentType: ArtifactContentType, Content: slices.Clone(content)}, ""
}

// The members of a ToolCallEvent's data, as bits of toolCallData.seen.
const (
	tcType = 1 << iota
	tcTraceID
	tcToolCallID
	tcToolID
	tcToolVersion
	tcTransport
	tcSideEffect
	tcIdempotency
	tcIdempotencyKey
	tcActor
	tcOK
	tcArgsRef
	tcArgsHash
	tcResultRef
	tcResultHash
	tcError
	tcTiming
	tcResources
	tcCapabilityIDs
	tcParentSpanID
	tcSessionID
	tcEPID
	tcServerID
	tcToolName
	tcPhase
	tcDecision
	tcReasonCodes
	tcReceiptID
	tcFlags
	tcRedactions
	tcPayloads
	tcSignature
	tcMCPMethod
	tcParentToolCallID

	// tcRequired is the schema's required list of data.
	tcRequired = tcType | tcTraceID | tcToolCallID | tcToolID | tcToolVersion | tcTransport | tcSideEffect |
		tcIdempotency | tcActor | tcOK | tcTiming | tcSessionID | tcEPID | tcServerID | tcToolName | tcPhase |
		tcDecision | tcReasonCodes | tcReceiptID | tcRedactions | tcSignature
)

// toolCallMaxBytes is the size above which the schema validator refuses
// any document.
const toolCallMaxBytes = 16 << 20

// toolCallData is what toolCallRowFast reads from data besides the row.
type toolCallData struct {
	seen           uint64
	started, ended string
	args, result   [2]int // offsets of the payload values; [0 0] when absent
	buf            []string
	codes, caps    [2]int
	flags          [2]int
	files, urls    [2]int
	redactionSpans [3][2]int
}

// toolCallRowFast is toolCallRowOf for an event the jsonReader takes and
// that toolcall_event.schema.json accepts, checked on the same pass: the
// checks below are the schema's, keyword by keyword, restricted where that
// is simpler (a time must be in the layout Talos publishes, an integer
// plain digits). It also requires what the general path checks after the
// schema (times from 1970, payloads that hash as published to args_hash /
// result_hash, refs naming them). ok is false for anything else; the
// caller then takes the general path, so a fast path that is stricter than
// the schema costs time, never a different outcome. The artifacts'
// Content is part of raw.
func toolCallRowFast(raw []byte, ce string, arts []Artifact) (ToolCallRow, []Artifact, bool) {
	row := ToolCallRow{CloudEvent: ce}
	if len(raw) > toolCallMaxBytes {
		return row, arts, false
	}
	r := jsonReader{s: ce}
	var (
		it   objectIter
		seen uint8
		tm   string
		d    toolCallData
	)
	if !r.object() {
		return row, arts, false
	}
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		valid := true
		switch key {
		case "data":
			seen |= 1 << 0
			valid = r.toolCallData(&row, &d)
		case "datacontenttype":
			valid = r.str() == "application/json"
		case "id":
			seen |= 1 << 1
			row.EventID = r.str()
			valid = isUUIDv7(row.EventID)
		case "source":
			seen |= 1 << 2
			valid = isTalosSource(r.str())
		case "specversion":
			seen |= 1 << 3
			valid = r.str() == "1.0"
		case "subject":
			seen |= 1 << 4
			valid = runesBetween(r.str(), 1, 256)
		case "time":
			seen |= 1 << 5
			tm = r.str()
		case "type":
			seen |= 1 << 6
			valid = r.str() == schemas.TypeToolCall
		default:
			valid = false
		}
		if !valid {
			r.fail()
		}
	}
	if !r.done() || seen != 1<<7-1 || d.seen&tcRequired != tcRequired ||
		(d.seen&tcArgsRef == 0) != (d.seen&tcArgsHash == 0) || (d.seen&tcResultRef == 0) != (d.seen&tcResultHash == 0) {
		return row, arts, false
	}
	var times [3]time.Time
	for i, s := range [3]string{tm, d.started, d.ended} {
		t, ok := parseEventTime(s)
		if !ok {
			return row, arts, false
		}
		times[i] = t
	}
	row.Time, row.TimeMS = times[0].Truncate(time.Second), uint64(times[0].UnixMilli())
	row.StartedAt, row.StartedAtMS = times[1].Truncate(time.Second), uint64(times[1].UnixMilli())
	row.EndedAt, row.EndedAtMS = times[2].Truncate(time.Second), uint64(times[2].UnixMilli())

	arts, ok := payloadArtifacts(raw, &row, &d, arts)
	if !ok {
		return row, arts, false
	}

	row.ReasonCodes, row.CapabilityIDs, row.Flags = part(d.buf, d.codes), part(d.buf, d.caps), part(d.buf, d.flags)
	row.ResourcesFiles, row.ResourcesURLs = part(d.buf, d.files), part(d.buf, d.urls)
	row.RedactionPointers = part(d.buf, d.redactionSpans[0])
	row.RedactionRules = part(d.buf, d.redactionSpans[1])
	row.RedactionPseudonyms = part(d.buf, d.redactionSpans[2])
	return row, arts, true
}

// payloadArtifacts checks the refs and hashes of row against each other
// and against the payloads d spans in raw, and appends the payloads'
// artifacts to arts. On failure arts is returned as it was given.
func payloadArtifacts(raw []byte, row *ToolCallRow, d *toolCallData, arts []Artifact) ([]Artifact, bool) {
	n := len(arts)
	for _, p := range [2]struct {
		hash, ref string
		span      [2]int
	}{{row.ArgsHash, row.ArgsRef, d.args}, {row.ResultHash, row.ResultRef, d.result}} {
		if p.ref != "" && !namesHash(p.ref, p.hash) {
			return arts[:n], false
		}
		if p.span[1] == 0 {
			continue
		}
		content := raw[p.span[0]:p.span[1]]
		if p.hash == "" || p.ref == "" || !hashesTo(content, p.hash) {
			return arts[:n], false
		}
		arts = append(arts, Artifact{Ref: p.ref, ContentType: ArtifactContentType, Content: content[:len(content):len(content)]})
	}
	return arts, true
}

// toolCallData reads data into row and d, checking the schema's "event".
// It is one switch over every member of data, two lines a member: split
// in two, each member of every ToolCallEvent the sink reads paid a second
// dispatch.
func (r *jsonReader) toolCallData(row *ToolCallRow, d *toolCallData) bool {
	if !r.object() {
		return false
	}
	d.buf = make([]string, 0, 16)
	var it objectIter
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		valid := false
		switch key {
		case "actor":
			valid = d.mark(tcActor) && r.actor(row)
		case "args_hash":
			valid = d.mark(tcArgsHash) && isHex64(r.strTo(&row.ArgsHash))
		case "args_ref":
			valid = d.mark(tcArgsRef) && isRef(r.strTo(&row.ArgsRef))
		case "capability_ids":
			valid = d.mark(tcCapabilityIDs) && r.checkedStringsTo(d, &d.caps, isCapabilityID)
		case "decision":
			valid = d.mark(tcDecision) && isDecision(r.strTo(&row.Decision))
		case "ep_id":
			valid = d.mark(tcEPID) && isIDOrEmpty(r.strTo(&row.EPID))
		case "error":
			valid = d.mark(tcError) && r.callError(row)
		case "flags":
			valid = d.mark(tcFlags) && r.checkedStringsTo(d, &d.flags, isFlag)
		case "idempotency":
			valid = d.mark(tcIdempotency) && isIdempotency(r.strTo(&row.Idempotency))
		case "idempotency_key":
			valid = d.mark(tcIdempotencyKey) && runesBetween(r.strTo(&row.IdempotencyKey), 1, 256)
		case "mcp_method":
			valid = d.mark(tcMCPMethod) && schemas.IsMCPMethod(r.strTo(&row.MCPMethod))
		case "ok":
			valid = d.mark(tcOK) && r.booleanTo(&row.OK)
		case "parent_span_id":
			valid = d.mark(tcParentSpanID) && runesBetween(r.strTo(&row.ParentSpanID), 1, 128)
		case "parent_tool_call_id":
			valid = d.mark(tcParentToolCallID) && isUUID(r.strTo(&row.ParentToolCallID))
		case "payloads":
			valid = d.mark(tcPayloads) && r.payloads(d)
		case "phase":
			valid = d.mark(tcPhase) && isPhase(r.strTo(&row.Phase))
		case "reason_codes":
			valid = d.mark(tcReasonCodes) && r.checkedStringsTo(d, &d.codes, isReasonCode)
		case "receipt_id":
			valid = d.mark(tcReceiptID) && isUUIDv7(r.strTo(&row.ReceiptID))
		case "redactions":
			valid = d.mark(tcRedactions) && r.redactions(d)
		case "resources_touched":
			valid = d.mark(tcResources) && r.resources(d)
		case "result_hash":
			valid = d.mark(tcResultHash) && isHex64(r.strTo(&row.ResultHash))
		case "result_ref":
			valid = d.mark(tcResultRef) && isRef(r.strTo(&row.ResultRef))
		case "server_id":
			valid = d.mark(tcServerID) && isIDOrEmpty(r.strTo(&row.ServerID))
		case "session_id":
			valid = d.mark(tcSessionID) && runesBetween(r.strTo(&row.SessionID), 0, 256)
		case "side_effect":
			valid = d.mark(tcSideEffect) && isSideEffect(r.strTo(&row.SideEffect))
		case "signature":
			valid = d.mark(tcSignature) && r.signature(row)
		case "timing":
			valid = d.mark(tcTiming) && r.timing(row, d)
		case "tool_call_id":
			valid = d.mark(tcToolCallID) && isUUID(r.strTo(&row.ToolCallID))
		case "tool_id":
			valid = d.mark(tcToolID) && runesBetween(r.strTo(&row.ToolID), 1, 512)
		case "tool_name":
			valid = d.mark(tcToolName) && runesBetween(r.strTo(&row.ToolName), 0, 256)
		case "tool_version":
			valid = d.mark(tcToolVersion) && runesBetween(r.strTo(&row.ToolVersion), 1, 128)
		case "trace_id":
			valid = d.mark(tcTraceID) && isUUID(r.strTo(&row.TraceID))
		case "transport":
			valid = d.mark(tcTransport) && isTransport(r.strTo(&row.Transport))
		case "type":
			valid = d.mark(tcType) && r.str() == schemas.ToolCallEventKind
		}
		if !valid {
			r.fail()
		}
	}
	return !r.bad
}

// mark records that data has member bit; it is always true, to read as the
// first term of a member's check.
func (d *toolCallData) mark(bit uint64) bool {
	d.seen |= bit
	return true
}

// strTo reads a string into *p and returns it.
func (r *jsonReader) strTo(p *string) string {
	*p = r.str()
	return *p
}

// booleanTo reads a boolean into *p; r fails on anything else.
func (r *jsonReader) booleanTo(p *bool) bool {
	*p = r.boolean()
	return !r.bad
}

// checkedStringsTo reads an array of strings that each satisfy ok onto
// d.buf, its span into *span.
func (r *jsonReader) checkedStringsTo(d *toolCallData, span *[2]int, ok func(string) bool) bool {
	var valid bool
	d.buf, *span, valid = r.checkedStrings(d.buf, ok)
	return valid
}

func isDecision(s string) bool {
	return s == schemas.DecisionAllow || s == schemas.DecisionDeny || s == schemas.DecisionRequireApproval
}

func isIdempotency(s string) bool {
	return s == schemas.IdempotencyIdempotent || s == schemas.IdempotencyWithKey || s == schemas.IdempotencyNonIdempotent
}

func isPhase(s string) bool { return s == schemas.PhasePre || s == schemas.PhasePost }

func isSideEffect(s string) bool {
	return s == schemas.SideEffectRead || s == schemas.SideEffectWrite || s == schemas.SideEffectExecute
}

func isTransport(s string) bool {
	switch s {
	case "local", "mcp", "mex", "stage_bridge", "other":
		return true
	}
	return false
}

// checkedStrings reads an array of strings that each satisfy ok onto buf.
func (r *jsonReader) checkedStrings(buf []string, ok func(string) bool) ([]string, [2]int, bool) {
	buf, b := r.readStrings(buf)
	for _, s := range buf[b[0]:b[1]] {
		if !ok(s) {
			return buf, b, false
		}
	}
	return buf, b, !r.bad
}

// actor reads the schema's "actor".
func (r *jsonReader) actor(row *ToolCallRow) bool {
	if !r.object() {
		return false
	}
	var it objectIter
	kind := false
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		switch key {
		case "agent_id":
			row.AgentID = r.str()
			ok = runesBetween(row.AgentID, 1, 256)
		case "kind":
			row.ActorKind, kind = r.str(), true
			ok = row.ActorKind == "human" || row.ActorKind == "agent" || row.ActorKind == "system"
		case "model_id":
			row.ModelID = r.str()
			ok = runesBetween(row.ModelID, 1, 256)
		default:
			ok = false
		}
		if !ok {
			r.fail()
		}
	}
	return kind && !r.bad
}

// callError reads the schema's "error".
func (r *jsonReader) callError(row *ToolCallRow) bool {
	if !r.object() {
		return false
	}
	var it objectIter
	var code, kind bool
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		switch key {
		case "code":
			row.ErrorCode, code = r.str(), true
			ok = runesBetween(row.ErrorCode, 1, 128)
		case "kind":
			row.ErrorKind, kind = r.str(), true
			ok = runesBetween(row.ErrorKind, 1, 128)
		case "message":
			row.ErrorMessage = r.str()
		case "retryable":
			row.ErrorRetryable = r.boolean()
		default:
			ok = false
		}
		if !ok {
			r.fail()
		}
	}
	return code && kind && !r.bad
}

// timing reads the schema's "timing".
func (r *jsonReader) timing(row *ToolCallRow, d *toolCallData) bool {
	if !r.object() {
		return false
	}
	var it objectIter
	var seen int
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		switch key {
		case "duration_ms":
			seen |= 1
			if r.peek() == '-' {
				ok = false
				break
			}
			row.DurationMS = uint64(r.readInt())
		case "ended_at":
			seen |= 2
			d.ended = r.str()
		case "started_at":
			seen |= 4
			d.started = r.str()
		default:
			ok = false
		}
		if !ok {
			r.fail()
		}
	}
	return seen == 7 && !r.bad
}

// resources reads the schema's "resources_touched".
func (r *jsonReader) resources(d *toolCallData) bool {
	if !r.object() {
		return false
	}
	var it objectIter
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		switch key {
		case "artifacts", "workspace_ids":
			var b [2]int
			d.buf, b = r.readStrings(d.buf)
			d.buf = d.buf[:b[0]]
		case "files":
			d.buf, d.files = r.readStrings(d.buf)
		case "urls":
			d.buf, d.urls = r.readStrings(d.buf)
		default:
			r.fail()
		}
	}
	return !r.bad
}

// redactions reads the schema's "redactions" into three runs of d.buf:
// pointers, rules, pseudonyms.
func (r *jsonReader) redactions(d *toolCallData) bool {
	if !r.array() {
		return false
	}
	var local [3 * 8]string // pointer, rule, pseudonym of each redaction
	triples := local[:0]
	for n := 0; r.elem(&n); {
		if !r.object() {
			return false
		}
		var it objectIter
		var p, ru, ps string
		var seen int
		for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
			switch key {
			case "pointer":
				p, seen = r.str(), seen|1
				ok = isRedactionPointer(p)
			case "pseudonym":
				ps, seen = r.str(), seen|2
				ok = isPseudonym(ps)
			case "rule":
				ru, seen = r.str(), seen|4
				ok = runesBetween(ru, 1, 128)
			default:
				ok = false
			}
			if !ok {
				r.fail()
			}
		}
		if seen != 7 {
			return false
		}
		triples = append(triples, p, ru, ps)
	}
	for col := range 3 {
		from := len(d.buf)
		for i := col; i < len(triples); i += 3 {
			d.buf = append(d.buf, triples[i])
		}
		d.redactionSpans[col] = [2]int{from, len(d.buf)}
	}
	return !r.bad
}

// payloads reads the schema's "payloads": the offsets of args and result.
func (r *jsonReader) payloads(d *toolCallData) bool {
	if !r.object() {
		return false
	}
	var it objectIter
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		start := r.i
		r.skip()
		switch key {
		case "args":
			d.args = [2]int{start, r.i}
		case "result":
			d.result = [2]int{start, r.i}
		default:
			r.fail()
		}
	}
	return !r.bad
}

// signature reads receipt.schema.json's "signature".
func (r *jsonReader) signature(row *ToolCallRow) bool {
	if !r.object() {
		return false
	}
	var it objectIter
	var seen int
	for key, ok := r.next(&it); ok; key, ok = r.next(&it) {
		switch key {
		case "alg":
			seen |= 1
			ok = r.str() == schemas.SignatureAlg
		case "kid":
			seen |= 2
			row.SignerKID = r.str()
			ok = runesBetween(row.SignerKID, 1, 256)
		case "sig":
			seen |= 4
			ok = isSignatureValue(r.str())
		default:
			ok = false
		}
		if !ok {
			r.fail()
		}
	}
	return seen == 7 && !r.bad
}

// namesHash reports whether ref is "sha256:" + hash.
func namesHash(ref, hash string) bool {
	return len(ref) == len("sha256:")+len(hash) && strings.HasPrefix(ref, "sha256:") && ref[len("sha256:"):] == hash
}

// hashesTo reports whether hex sha256 of content is hash.
func hashesTo(content []byte, hash string) bool {
	sum := sha256.Sum256(content)
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	return string(hx[:]) == hash
}

// Matchers of the schema's patterns and lengths (toolcall_event.schema.json
// and the definitions it refers to); TestToolCallMatchersAgreeWithSchema
// holds each to its pattern.

func runesBetween(s string, lo, hi int) bool {
	if len(s) < lo {
		return false
	}
	n := utf8.RuneCountInString(s)
	return n >= lo && n <= hi
}

func isHexLower(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// isUUID: ^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < 36; i++ {
		c := s[i]
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if c != '-' {
				return false
			}
		} else if (c < '0' || c > '9') && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
			return false
		}
	}
	return true
}

// isUUIDv7: ^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$
func isUUIDv7(s string) bool {
	return len(s) == 36 && s[8] == '-' && s[13] == '-' && s[18] == '-' && s[23] == '-' && s[14] == '7' &&
		strings.IndexByte("89ab", s[19]) >= 0 &&
		isHexLower(s[:8]) && isHexLower(s[9:13]) && isHexLower(s[14:18]) && isHexLower(s[19:23]) && isHexLower(s[24:])
}

// isHex64: ^[0-9a-f]{64}$
func isHex64(s string) bool { return len(s) == 64 && isHexLower(s) }

// isRef: ^sha256:[0-9a-f]{64}$
func isRef(s string) bool { return strings.HasPrefix(s, "sha256:") && isHex64(s[len("sha256:"):]) }

// isIDOrEmpty: ^([a-z0-9][a-z0-9_-]{0,63})?$
func isIDOrEmpty(s string) bool {
	if s == "" {
		return true
	}
	if len(s) > 64 || !isLowerAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isLowerAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isLowerAlnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }

// isReasonCode: ^[A-Z][A-Z0-9_-]{0,63}$
func isReasonCode(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// isFlag: ^[a-z][a-z0-9_]{0,63}$
func isFlag(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isLowerAlnum(c) && c != '_' {
			return false
		}
	}
	return true
}

// isCapabilityID: a string of 1 to 128 characters.
func isCapabilityID(s string) bool { return runesBetween(s, 1, 128) }

// isRedactionPointer: ^(/([^~/]|~[01])*)+$
func isRedactionPointer(s string) bool { return s != "" && jsonkit.ValidPointer(s) }

// isPseudonym: ^hmac-sha256:[^:]+:[0-9a-f]{64}$
func isPseudonym(s string) bool {
	rest, ok := strings.CutPrefix(s, "hmac-sha256:")
	if !ok {
		return false
	}
	k := strings.IndexByte(rest, ':')
	return k > 0 && isHex64(rest[k+1:])
}

// isSignatureValue: ^[A-Za-z0-9_-]{86}$
func isSignatureValue(s string) bool {
	if len(s) != 86 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isLowerAlnum(c) && (c < 'A' || c > 'Z') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// isTalosSource: ^talos://[^/\s]+/\S+$ (\s being [\t\n\f\r ]).
func isTalosSource(s string) bool {
	rest, ok := strings.CutPrefix(s, "talos://")
	if !ok || strings.ContainsAny(rest, "\t\n\f\r ") {
		return false
	}
	k := strings.IndexByte(rest, '/')
	return k > 0 && k < len(rest)-1
}

// CompareToolCallColumns returns the names of the columns whose stored value
// in row differs from fromEvent, the row ToolCallRowFromEvent derives from
// row.CloudEvent; nil means the row agrees with its own signed JSON.
// inserted_at is not compared; times are compared at the DateTime's
// one-second precision; nil and empty arrays are equal.
func CompareToolCallColumns(row, fromEvent ToolCallRow) []string {
	return diffColumns(toolCallInsertColumns, row.insertValues(), fromEvent.insertValues())
}

// InsertToolCalls writes rows to database.tool_calls in one INSERT.
// Inserting a row twice is harmless: v_tool_calls dedupes by tool_call_id.
func InsertToolCalls(ctx context.Context, conn driver.Conn, database string, rows []ToolCallRow) error {
	return insertTable(ctx, conn, database, TableToolCalls, toolCallColumns, rows, func(err error) error {
		return fmt.Errorf("query: insert %d tool calls: %w", len(rows), err)
	})
}

// artifactColumns are the columns an artifact is inserted with.
var artifactColumns = []insertColumn[Artifact]{
	{name: "ref", str: func(a *Artifact) string { return a.Ref }},
	{name: "content_type", str: func(a *Artifact) string { return a.ContentType }},
	{name: "size_bytes", u64: func(a *Artifact) uint64 { return uint64(len(a.Content)) }},
	{name: "content", raw: func(a *Artifact) []byte { return a.Content }},
}

// InsertArtifacts writes arts to database.artifacts in one INSERT; an
// artifact listed twice (the same payload in several calls) is written
// once. Artifacts are content-addressed, so re-inserting one is harmless.
func InsertArtifacts(ctx context.Context, conn driver.Conn, database string, arts []Artifact) error {
	seen := make(map[string]bool, len(arts))
	once := make([]Artifact, 0, len(arts))
	for _, a := range arts {
		if !seen[a.Ref] {
			seen[a.Ref] = true
			once = append(once, a)
		}
	}
	return insertTable(ctx, conn, database, TableArtifacts, artifactColumns, once, func(err error) error {
		return fmt.Errorf("query: insert %d artifacts: %w", len(once), err)
	})
}

// Artifacts returns the stored artifacts with the given refs (each once).
func Artifacts(ctx context.Context, conn driver.Conn, database string, refs []string) ([]Artifact, error) {
	if len(refs) == 0 {
		return nil, nil
	}
	tbl, err := table(database, TableArtifacts)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, "SELECT ref, content_type, content FROM "+tbl+" WHERE has(?, ref) ORDER BY ref LIMIT 1 BY ref", refs)
	if err != nil {
		return nil, fmt.Errorf("query: artifacts: %w", err)
	}
	defer rows.Close()
	var out []Artifact
	for rows.Next() {
		var a Artifact
		var content string
		if err := rows.Scan(&a.Ref, &a.ContentType, &content); err != nil {
			return nil, fmt.Errorf("query: artifacts: %w", err)
		}
		a.Content = []byte(content)
		out = append(out, a)
	}
	return out, rows.Err()
}

// ToolCallRejection is one row of tool_call_rejections: a ToolCallEvent
// the flight recorder refused, kept as received except for its payloads.
type ToolCallRejection struct {
	EventID   string    // CloudEvent id, or "stream-seq:<n>" when it has none
	Time      time.Time // CloudEvent time (1970 when unreadable), to the second
	TimeMS    uint64
	Subject   string // the TALOS_AUDIT subject it arrived on
	StreamSeq uint64 // its TALOS_AUDIT sequence
	Missing   []string
	Reason    string
	// CloudEvent is the record as received with data.payloads removed: a
	// payload that does not match its hash may be the unredacted one, so
	// a rejection never stores payloads (its signature no longer verifies;
	// the original stays in TALOS_AUDIT at StreamSeq).
	CloudEvent string
}

// payloadsWithheld ends the Reason of a rejection stored without the
// data.payloads the event carried.
const payloadsWithheld = " (data.payloads not stored)"

// PayloadsWithheld reports whether r was stored without the payloads its
// event carried: then its signature, which covers them, cannot hold on
// CloudEvent.
func (r *ToolCallRejection) PayloadsWithheld() bool {
	return strings.HasSuffix(r.Reason, payloadsWithheld)
}

// RejectionOf builds the tool_call_rejections row of rec, refused with rej.
func RejectionOf(rec schemas.AuditRecord, rej *RejectedToolCall) ToolCallRejection {
	stored, withheld := withoutPayloads(rec.Data)
	r := ToolCallRejection{Subject: rec.Subject, StreamSeq: rec.StreamSeq, Missing: nonNil(rej.Missing),
		Reason: rej.Reason, CloudEvent: string(stored), Time: time.Unix(0, 0).UTC()}
	if withheld {
		r.Reason += payloadsWithheld
	}
	var env toolCallEnvelope
	_ = json.Unmarshal(rec.Data, &env)
	r.EventID = env.ID
	if strings.TrimSpace(r.EventID) == "" {
		r.EventID = fmt.Sprintf("stream-seq:%d", rec.StreamSeq)
	}
	if t, err := time.Parse(time.RFC3339Nano, env.Time); err == nil && !t.Before(time.Unix(0, 0)) {
		r.Time, r.TimeMS = t.UTC().Truncate(time.Second), uint64(t.UnixMilli())
	}
	return r
}

// withoutPayloads returns raw without data.payloads (and without a data
// member that is not an object, which cannot be told apart from a payload),
// and whether anything was removed. A record that is not a JSON object is
// returned as it is: the sink dead-letters those before getting here.
func withoutPayloads(raw []byte) ([]byte, bool) {
	var ev map[string]json.RawMessage
	if err := json.Unmarshal(raw, &ev); err != nil {
		return raw, false
	}
	d, ok := ev["data"]
	if !ok {
		return raw, false
	}
	var data map[string]json.RawMessage
	if err := json.Unmarshal(d, &data); err != nil || data == nil {
		delete(ev, "data")
	} else if _, has := data["payloads"]; has {
		delete(data, "payloads")
		b, err := json.Marshal(data)
		if err != nil {
			delete(ev, "data")
		} else {
			ev["data"] = b
		}
	} else {
		return raw, false
	}
	out, err := json.Marshal(ev)
	if err != nil {
		return []byte("{}"), true
	}
	return out, true
}

const rejectionColumnsSQL = "event_id, time, time_ms, subject, stream_seq, missing, reason, cloudevent"

// InsertToolCallRejections writes rej to database.tool_call_rejections.
func InsertToolCallRejections(ctx context.Context, conn driver.Conn, database string, rej []ToolCallRejection) error {
	return insertEach(ctx, conn, database, TableToolCallRejections, rejectionColumnsSQL, rej, "tool call rejection",
		func(r *ToolCallRejection) string { return r.EventID },
		func(r *ToolCallRejection) []any {
			return []any{r.EventID, r.Time.UTC(), r.TimeMS, r.Subject, r.StreamSeq, nonNil(r.Missing), r.Reason, r.CloudEvent}
		})
}

// ToolCallRejections returns the rejected ToolCallEvents of database
// (one row per event id), oldest first, at most limit rows (0 = all).
func ToolCallRejections(ctx context.Context, conn driver.Conn, database string, limit int) ([]ToolCallRejection, error) {
	tbl, err := table(database, TableToolCallRejections)
	if err != nil {
		return nil, err
	}
	q := limited("SELECT "+rejectionColumnsSQL+" FROM "+tbl+" ORDER BY time_ms, event_id, inserted_at LIMIT 1 BY event_id", limit)
	return selectAll(ctx, conn, "tool call rejections", q, func(rows driver.Rows, r *ToolCallRejection) error {
		err := rows.Scan(&r.EventID, &r.Time, &r.TimeMS, &r.Subject, &r.StreamSeq, &r.Missing, &r.Reason, &r.CloudEvent)
		r.Time = r.Time.UTC()
		return err
	})
}

// ToolCalls returns v_tool_calls (one row per tool_call_id), oldest first,
// at most limit rows (0 = all).
func ToolCalls(ctx context.Context, conn driver.Conn, database string, limit int) ([]ToolCallRow, error) {
	v, err := table(database, ViewToolCalls)
	if err != nil {
		return nil, err
	}
	q := limited("SELECT "+toolCallColumnsSQL+" FROM "+v+" ORDER BY time_ms, tool_call_id", limit)
	return selectAll(ctx, conn, "tool calls", q, func(rows driver.Rows, r *ToolCallRow) error { return r.scan(rows) })
}

// SecretUse is one call that used a secret, found by its pseudonym.
type SecretUse struct {
	Time       time.Time // the ToolCallEvent's time (milliseconds)
	ToolCallID string
	AgentID    string
	ServerID   string
	ToolName   string
	Pointer    string // where the secret was, e.g. /args/headers/authorization
	Rule       string // which redaction rule found it
}

// SecretUses answers "every call that used this secret" as v_secret_uses
// does: the calls whose redactions carry pseudonym ("hmac-sha256:<kid>:<hex>"),
// oldest first, at most limit rows (0 = all). The secret itself is never
// stored, so the caller computes the pseudonym with the redaction key.
//
// It reads tool_calls directly, only the calls that carry the pseudonym and
// only the columns it returns (the view would sort every stored event,
// payloads included, which exhausts ClickHouse's memory on large tables);
// for those calls it picks the same row as v_tool_calls and the same
// redaction as v_secret_uses.
func SecretUses(ctx context.Context, conn driver.Conn, database, pseudonym string, limit int) ([]SecretUse, error) {
	tbl, err := table(database, TableToolCalls)
	if err != nil {
		return nil, err
	}
	q := `SELECT time_ms, ep_id, tool_call_id, agent_id, server_id, tool_name,
	redaction_pointers[i] AS pointer, redaction_rules[i] AS rule, redaction_pseudonyms[i] AS p
FROM (
	SELECT time_ms, ep_id, tool_call_id, agent_id, server_id, tool_name, redaction_pointers, redaction_rules, redaction_pseudonyms
	FROM ` + tbl + `
	WHERE tool_call_id IN (SELECT tool_call_id FROM ` + tbl + ` WHERE has(redaction_pseudonyms, ?))
	ORDER BY ep_id, tool_call_id, time_ms, event_id, inserted_at
	LIMIT 1 BY ep_id, tool_call_id
)
ARRAY JOIN arrayEnumerate(redaction_pseudonyms) AS i
WHERE p = ?
ORDER BY ep_id, tool_call_id, i
LIMIT 1 BY ep_id, tool_call_id`
	q = limited("SELECT time_ms, tool_call_id, agent_id, server_id, tool_name, pointer, rule FROM ("+q+") ORDER BY time_ms, tool_call_id", limit)
	return selectAll(ctx, conn, "secret uses", q, func(rows driver.Rows, u *SecretUse) error {
		var ms uint64
		err := rows.Scan(&ms, &u.ToolCallID, &u.AgentID, &u.ServerID, &u.ToolName, &u.Pointer, &u.Rule)
		u.Time = time.UnixMilli(int64(ms)).UTC()
		return err
	}, pseudonym, pseudonym)
}

// streamToolCalls calls fn for every distinct stored row of
// database.tool_calls, ordered by event_id: identical copies (a sink
// redelivery) reach fn once; the event_ids stored as rows that differ are
// returned as conflicts after fn has seen every variant.
func streamToolCalls(ctx context.Context, conn driver.Conn, database string, fn func(ToolCallRow) error) (conflicts []string, err error) {
	tbl, err := table(database, TableToolCalls)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(streamContext(ctx), "SELECT "+toolCallColumnsSQL+" FROM "+tbl+" ORDER BY event_id")
	if err != nil {
		return nil, fmt.Errorf("query: stream tool calls: %w", err)
	}
	defer rows.Close()
	var group []ToolCallRow
	for rows.Next() {
		var r ToolCallRow
		if err := r.scan(rows); err != nil {
			return nil, fmt.Errorf("query: stream tool calls: %w", err)
		}
		if len(group) > 0 && group[0].EventID != r.EventID {
			group = group[:0]
		}
		if slices.ContainsFunc(group, func(g ToolCallRow) bool { return len(CompareToolCallColumns(g, r)) == 0 }) {
			continue
		}
		group = append(group, r)
		if len(group) == 2 {
			conflicts = append(conflicts, r.EventID)
		}
		if err := fn(r); err != nil {
			return nil, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query: stream tool calls: %w", err)
	}
	return conflicts, nil
}
