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

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/gowebpki/jcs"

	"github.com/talos-audit/talos/schemas"
)

// ToolCallRow is one row of tool_calls: a ToolCallEvent (FR-EVT-007, seed
// 001) flattened for auditors. Every column except InsertedAt is derived
// from CloudEvent, the exact signed JSON, by ToolCallRowFromEvent, and
// CompareToolCallColumns tells when a stored row was altered.
type ToolCallRow struct {
	EventID     string    // CloudEvent id
	Time        time.Time // CloudEvent time, truncated to the second
	TimeMS      uint64    // CloudEvent time, unix milliseconds
	ToolCallID  string
	TraceID     string
	SessionID   string
	EPID        string
	ServerID    string
	ToolName    string
	ToolID      string
	ToolVersion string
	Transport   string
	SideEffect  string
	OK          bool
	ArgsHash    string
	ResultHash  string
	ArgsRef     string
	ResultRef   string
	ErrorCode   string
	StartedAt   time.Time // timing.started_at, truncated to the second
	StartedAtMS uint64
	EndedAt     time.Time // timing.ended_at, truncated to the second
	EndedAtMS   uint64
	DurationMS  uint64

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

// toolCallInsertColumns are the columns InsertToolCalls writes, in the order
// of ToolCallRow.insertValues: toolCallColumnsSQL without inserted_at (left
// to its DEFAULT).
var toolCallInsertColumns = strings.Split(strings.TrimSuffix(toolCallColumnsSQL, ", inserted_at"), ", ")

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

func (r *ToolCallRow) insertValues() []any {
	return []any{
		r.EventID, r.Time.UTC(), r.TimeMS, r.ToolCallID, r.TraceID, r.SessionID, r.EPID, r.ServerID, r.ToolName,
		r.ToolID, r.ToolVersion, r.Transport, r.SideEffect, boolByte(r.OK), r.ArgsHash, r.ResultHash, r.ArgsRef,
		r.ResultRef, r.ErrorCode, r.StartedAt.UTC(), r.StartedAtMS, r.EndedAt.UTC(), r.EndedAtMS, r.DurationMS,
		r.Phase, r.Decision, nonNil(r.ReasonCodes), r.ReceiptID, r.Idempotency, r.IdempotencyKey, r.ActorKind,
		r.AgentID, r.ModelID, r.ErrorKind, r.ErrorMessage, boolByte(r.ErrorRetryable), nonNil(r.CapabilityIDs),
		r.ParentSpanID, nonNil(r.ResourcesFiles), nonNil(r.ResourcesURLs), nonNil(r.Flags),
		nonNil(r.RedactionPointers), nonNil(r.RedactionRules), nonNil(r.RedactionPseudonyms), r.SignerKID, r.CloudEvent,
	}
}

// scan reads one row selected with toolCallColumnsSQL.
func (r *ToolCallRow) scan(rows driver.Rows) error {
	var ok, retryable uint8
	err := rows.Scan(
		&r.EventID, &r.Time, &r.TimeMS, &r.ToolCallID, &r.TraceID, &r.SessionID, &r.EPID, &r.ServerID, &r.ToolName,
		&r.ToolID, &r.ToolVersion, &r.Transport, &r.SideEffect, &ok, &r.ArgsHash, &r.ResultHash, &r.ArgsRef,
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
// the flight recorder refuses (seed 001): it fails its schema (Missing
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

// RequiredToolCallFields are the fields without which seed 001's flight
// recorder MUST reject a ToolCallEvent.
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
func ToolCallRowFromEvent(raw []byte) (ToolCallRow, []Artifact, error) {
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
			{"args", ev.ArgsHash, ev.ArgsRef, ev.Payloads.Args},
			{"result", ev.ResultHash, ev.ResultRef, ev.Payloads.Result},
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

	row := ToolCallRow{
		EventID: env.ID, Time: times[0].Truncate(time.Second), TimeMS: uint64(times[0].UnixMilli()),
		ToolCallID: ev.ToolCallID, TraceID: ev.TraceID, SessionID: ev.SessionID, EPID: ev.EPID, ServerID: ev.ServerID,
		ToolName: ev.ToolName, ToolID: ev.ToolID, ToolVersion: ev.ToolVersion, Transport: ev.Transport,
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
		CloudEvent:          string(raw),
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
	return row, arts, nil
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

// CompareToolCallColumns returns the names of the columns whose stored value
// in row differs from fromEvent, the row ToolCallRowFromEvent derives from
// row.CloudEvent; nil means the row agrees with its own signed JSON.
// inserted_at is not compared; times are compared at the DateTime's
// one-second precision; nil and empty arrays are equal.
func CompareToolCallColumns(row, fromEvent ToolCallRow) []string {
	return diffColumns(toolCallInsertColumns, row.insertValues(), fromEvent.insertValues())
}

// InsertToolCalls writes rows to database.tool_calls in one batch.
// Inserting a row twice is harmless: v_tool_calls dedupes by tool_call_id.
func InsertToolCalls(ctx context.Context, conn driver.Conn, database string, rows []ToolCallRow) error {
	if len(rows) == 0 {
		return nil
	}
	tbl, err := table(database, TableToolCalls)
	if err != nil {
		return err
	}
	// 18.16 needs the explicit column list (and a batch, not Exec with VALUES).
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+tbl+" ("+strings.Join(toolCallInsertColumns, ", ")+")")
	if err != nil {
		return fmt.Errorf("query: insert tool calls: %w", err)
	}
	for i := range rows {
		if err := b.Append(rows[i].insertValues()...); err != nil {
			b.Abort()
			return fmt.Errorf("query: insert tool call event %s: %w", rows[i].EventID, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("query: insert %d tool calls: %w", len(rows), err)
	}
	return nil
}

// InsertArtifacts writes arts to database.artifacts in one batch; an
// artifact listed twice (the same payload in several calls) is written
// once. Artifacts are content-addressed, so re-inserting one is harmless.
func InsertArtifacts(ctx context.Context, conn driver.Conn, database string, arts []Artifact) error {
	if len(arts) == 0 {
		return nil
	}
	tbl, err := table(database, TableArtifacts)
	if err != nil {
		return err
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+tbl+" (ref, content_type, size_bytes, content)")
	if err != nil {
		return fmt.Errorf("query: insert artifacts: %w", err)
	}
	seen := make(map[string]bool, len(arts))
	for _, a := range arts {
		if seen[a.Ref] {
			continue
		}
		seen[a.Ref] = true
		if err := b.Append(a.Ref, a.ContentType, uint64(len(a.Content)), string(a.Content)); err != nil {
			b.Abort()
			return fmt.Errorf("query: insert artifact %s: %w", a.Ref, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("query: insert %d artifacts: %w", len(seen), err)
	}
	return nil
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

// RejectionOf builds the tool_call_rejections row of rec, refused with rej.
func RejectionOf(rec schemas.AuditRecord, rej *RejectedToolCall) ToolCallRejection {
	stored, withheld := withoutPayloads(rec.Data)
	r := ToolCallRejection{Subject: rec.Subject, StreamSeq: rec.StreamSeq, Missing: nonNil(rej.Missing),
		Reason: rej.Reason, CloudEvent: string(stored), Time: time.Unix(0, 0).UTC()}
	if withheld {
		r.Reason += " (data.payloads not stored)"
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
	if len(rej) == 0 {
		return nil
	}
	tbl, err := table(database, TableToolCallRejections)
	if err != nil {
		return err
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+tbl+" ("+rejectionColumnsSQL+")")
	if err != nil {
		return fmt.Errorf("query: insert tool call rejections: %w", err)
	}
	for _, r := range rej {
		if err := b.Append(r.EventID, r.Time.UTC(), r.TimeMS, r.Subject, r.StreamSeq, nonNil(r.Missing), r.Reason, r.CloudEvent); err != nil {
			b.Abort()
			return fmt.Errorf("query: insert tool call rejection %s: %w", r.EventID, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("query: insert %d tool call rejections: %w", len(rej), err)
	}
	return nil
}

// ToolCallRejections returns the rejected ToolCallEvents of database
// (one row per event id), oldest first, at most limit rows (0 = all).
func ToolCallRejections(ctx context.Context, conn driver.Conn, database string, limit int) ([]ToolCallRejection, error) {
	tbl, err := table(database, TableToolCallRejections)
	if err != nil {
		return nil, err
	}
	q := "SELECT " + rejectionColumnsSQL + " FROM " + tbl + " ORDER BY time_ms, event_id, inserted_at LIMIT 1 BY event_id"
	if limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", limit)
	}
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("query: tool call rejections: %w", err)
	}
	defer rows.Close()
	var out []ToolCallRejection
	for rows.Next() {
		var r ToolCallRejection
		if err := rows.Scan(&r.EventID, &r.Time, &r.TimeMS, &r.Subject, &r.StreamSeq, &r.Missing, &r.Reason, &r.CloudEvent); err != nil {
			return nil, fmt.Errorf("query: tool call rejections: %w", err)
		}
		r.Time = r.Time.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}

// ToolCalls returns v_tool_calls (one row per tool_call_id), oldest first,
// at most limit rows (0 = all).
func ToolCalls(ctx context.Context, conn driver.Conn, database string, limit int) ([]ToolCallRow, error) {
	v, err := table(database, ViewToolCalls)
	if err != nil {
		return nil, err
	}
	q := "SELECT " + toolCallColumnsSQL + " FROM " + v + " ORDER BY time_ms, tool_call_id"
	if limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", limit)
	}
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("query: tool calls: %w", err)
	}
	defer rows.Close()
	var out []ToolCallRow
	for rows.Next() {
		var r ToolCallRow
		if err := r.scan(rows); err != nil {
			return nil, fmt.Errorf("query: tool calls: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
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

// SecretUses answers "every call that used this secret" from v_secret_uses:
// the calls whose redactions carry pseudonym ("hmac-sha256:<kid>:<hex>"),
// oldest first, at most limit rows (0 = all). The secret itself is never
// stored, so the caller computes the pseudonym with the redaction key.
func SecretUses(ctx context.Context, conn driver.Conn, database, pseudonym string, limit int) ([]SecretUse, error) {
	v, err := table(database, ViewSecretUses)
	if err != nil {
		return nil, err
	}
	q := "SELECT time_ms, tool_call_id, agent_id, server_id, tool_name, pointer, rule FROM " + v +
		" WHERE pseudonym = ? ORDER BY time_ms, tool_call_id"
	if limit > 0 {
		q += fmt.Sprintf(" LIMIT %d", limit)
	}
	rows, err := conn.Query(ctx, q, pseudonym)
	if err != nil {
		return nil, fmt.Errorf("query: secret uses: %w", err)
	}
	defer rows.Close()
	var out []SecretUse
	for rows.Next() {
		var u SecretUse
		var ms uint64
		if err := rows.Scan(&ms, &u.ToolCallID, &u.AgentID, &u.ServerID, &u.ToolName, &u.Pointer, &u.Rule); err != nil {
			return nil, fmt.Errorf("query: secret uses: %w", err)
		}
		u.Time = time.UnixMilli(int64(ms)).UTC()
		out = append(out, u)
	}
	return out, rows.Err()
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
