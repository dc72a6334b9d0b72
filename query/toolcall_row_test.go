package query

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gowebpki/jcs"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
	"github.com/talos-audit/talos/schemas/jsonkit"
)

// pseudonymOf is the keyed pseudonym of a secret, computed here
// independently of the redaction code: hmac-sha256:<kid>:<hex>.
func pseudonymOf(kid, secret string) string {
	m := hmac.New(sha256.New, []byte("test redaction key"))
	m.Write([]byte(secret))
	return "hmac-sha256:" + kid + ":" + hex.EncodeToString(m.Sum(nil))
}

func canonical(t testing.TB, s string) json.RawMessage {
	t.Helper()
	b, err := jcs.Transform([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// plantedToken is the secret the redacted payloads once held; it must never
// reach a row, an artifact, a rejection reason or an error.
const plantedToken = "ghp_R4wS3cr3tT0k3nV4lu3AAAAAAAAAAAAAAAA"

// toolCallEvent is a fully populated ToolCallEvent whose payloads were
// redacted (the token replaced by its pseudonym at two pointers).
func toolCallEvent(t testing.TB, callID string, at time.Time) schemas.ToolCallEvent {
	t.Helper()
	args := canonical(t, `{"path":"/work/a.txt","headers":{"authorization":"[REDACTED]"},"token":"[REDACTED]"}`)
	result := canonical(t, `{"content":[{"type":"text","text":"hello"}],"isError":false}`)
	p := pseudonymOf("rk1", plantedToken)
	return schemas.ToolCallEvent{
		Type: schemas.ToolCallEventKind, TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736", ToolCallID: callID,
		ToolID: "files/read_file", ToolVersion: "1.2.3", Transport: "mcp", SideEffect: schemas.SideEffectRead,
		Idempotency: schemas.IdempotencyWithKey, IdempotencyKey: "idem-1",
		Actor: schemas.Actor{Kind: "agent", AgentID: "agent-7", ModelID: "model-x"}, OK: false,
		ArgsRef: "sha256:" + sha256Hex(args), ArgsHash: sha256Hex(args),
		ResultRef: "sha256:" + sha256Hex(result), ResultHash: sha256Hex(result),
		Error: &schemas.CallError{Code: "E_PARTIAL", Kind: "tool", Message: "partial read", Retryable: new(true)},
		Timing: schemas.EventTiming{StartedAt: at.Add(-80 * time.Millisecond).Format(schemas.TimeFormat),
			EndedAt: at.Add(-3 * time.Millisecond).Format(schemas.TimeFormat), DurationMS: 77},
		Resources:     &schemas.ResourcesTouched{Files: []string{"/work/a.txt"}, URLs: []string{"https://example.com/x"}},
		CapabilityIDs: []string{"cap-root", "cap-child"}, ParentSpanID: "span-1",
		SessionID: "sess-1", EPID: "gw-1", ServerID: "files", ToolName: "read_file", Phase: schemas.PhasePost,
		Decision: schemas.DecisionAllow, ReasonCodes: []string{schemas.CodeToolUnclassifiedAllowedDev},
		ReceiptID: "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d70", Flags: []string{schemas.FlagPostWithoutPre},
		Redactions: []schemas.Redaction{
			{Pointer: "/args/headers/authorization", Rule: "bearer_header", Pseudonym: p},
			{Pointer: "/args/token", Rule: "github_token", Pseudonym: p},
		},
		Payloads: &schemas.Payloads{Args: jsonkit.Canonical(args), Result: jsonkit.Canonical(result)},
	}
}

// signed signs v (a ToolCallEvent or a map standing for one) as a
// dev.talos.toolcall.v1 CloudEvent.
func signed(t testing.TB, key *receipts.PrivateKey, subject string, at time.Time, v any) []byte {
	t.Helper()
	s, err := receipts.SignEvent(key, receipts.Meta{Type: schemas.TypeToolCall, Source: "talos://enforce/w1", Subject: subject, Time: at}, v)
	if err != nil {
		t.Fatal(err)
	}
	return s.JSON
}

// asMap turns ev into a generic object a test can damage.
func asMap(t testing.TB, ev schemas.ToolCallEvent) map[string]any {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func testKey(t testing.TB) *receipts.PrivateKey {
	t.Helper()
	k, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var tcAt = time.Date(2026, 5, 6, 7, 8, 9, 456e6, time.UTC)

const callA = "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e"

func TestToolCallRowFromEvent(t *testing.T) {
	key := testKey(t)
	ev := toolCallEvent(t, callA, tcAt)
	raw := signed(t, key, callA, tcAt, &ev)
	if err := schemas.ValidateToolCallEvent(raw); err != nil {
		t.Fatalf("fixture does not validate: %v", err)
	}
	row, arts, err := ToolCallRowFromEvent(raw)
	if err != nil {
		t.Fatal(err)
	}
	var ce struct{ ID string }
	json.Unmarshal(raw, &ce)
	p := pseudonymOf("rk1", plantedToken)
	want := ToolCallRow{
		EventID: ce.ID, Time: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC), TimeMS: uint64(tcAt.UnixMilli()),
		ToolCallID: callA, TraceID: ev.TraceID, SessionID: "sess-1", EPID: "gw-1", ServerID: "files", ToolName: "read_file",
		ToolID: "files/read_file", ToolVersion: "1.2.3", Transport: "mcp", SideEffect: "READ", OK: false,
		ArgsHash: ev.ArgsHash, ResultHash: ev.ResultHash, ArgsRef: ev.ArgsRef, ResultRef: ev.ResultRef, ErrorCode: "E_PARTIAL",
		StartedAt: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC), StartedAtMS: uint64(tcAt.Add(-80 * time.Millisecond).UnixMilli()),
		EndedAt: time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC), EndedAtMS: uint64(tcAt.Add(-3 * time.Millisecond).UnixMilli()),
		DurationMS: 77, Phase: "post", Decision: "allow", ReasonCodes: []string{schemas.CodeToolUnclassifiedAllowedDev},
		ReceiptID: ev.ReceiptID, Idempotency: "IDEMPOTENT_WITH_KEY", IdempotencyKey: "idem-1", ActorKind: "agent",
		AgentID: "agent-7", ModelID: "model-x", ErrorKind: "tool", ErrorMessage: "partial read", ErrorRetryable: true,
		CapabilityIDs: []string{"cap-root", "cap-child"}, ParentSpanID: "span-1",
		ResourcesFiles: []string{"/work/a.txt"}, ResourcesURLs: []string{"https://example.com/x"},
		Flags:             []string{schemas.FlagPostWithoutPre},
		RedactionPointers: []string{"/args/headers/authorization", "/args/token"},
		RedactionRules:    []string{"bearer_header", "github_token"}, RedactionPseudonyms: []string{p, p},
		SignerKID: key.KID, CloudEvent: string(raw),
	}
	if d := CompareToolCallColumns(row, want); d != nil {
		t.Fatalf("columns differ: %v\ngot  %+v\nwant %+v", d, row, want)
	}
	if len(arts) != 2 {
		t.Fatalf("%d artifacts, want 2", len(arts))
	}
	for i, hash := range []string{ev.ArgsHash, ev.ResultHash} {
		a := arts[i]
		if sha256Hex(a.Content) != hash || a.Ref != "sha256:"+hash || a.ContentType != "application/json" {
			t.Errorf("artifact %d: ref %s, sha256(content) %s, want %s", i, a.Ref, sha256Hex(a.Content), hash)
		}
	}
	if strings.Contains(fmt.Sprint(row, arts), plantedToken) {
		t.Fatal("the secret reached the row")
	}

	// A minimal event (a pre-phase deny: no payloads, no error, no
	// resources) projects with empty arrays, not nulls.
	min := schemas.ToolCallEvent{Type: schemas.ToolCallEventKind, TraceID: ev.TraceID, ToolCallID: callA, ToolID: "files/rm",
		ToolVersion: schemas.UnregisteredToolVersion, Transport: "local", SideEffect: "WRITE", Idempotency: "NON_IDEMPOTENT",
		Actor: schemas.Actor{Kind: "system"}, Timing: ev.Timing, Phase: "pre", Decision: "deny",
		ReasonCodes: []string{"TOOL_UNCLASSIFIED_DENIED"}, ReceiptID: ev.ReceiptID, Redactions: []schemas.Redaction{}}
	row, arts, err = ToolCallRowFromEvent(signed(t, key, callA, tcAt, &min))
	if err != nil {
		t.Fatal(err)
	}
	if len(arts) != 0 || row.ArgsRef != "" || row.ErrorCode != "" || row.ErrorRetryable ||
		row.ResourcesFiles == nil || row.CapabilityIDs == nil || row.Flags == nil || row.RedactionPseudonyms == nil {
		t.Fatalf("minimal event: %d artifacts, row %+v", len(arts), row)
	}
}

func TestToolCallRowFromEventRejects(t *testing.T) {
	key := testKey(t)
	good := toolCallEvent(t, callA, tcAt)
	type mutation func(m map[string]any)
	cases := []struct {
		name    string
		mutate  mutation
		missing []string
		reason  string
	}{
		{"hash of the raw payload", func(m map[string]any) {
			// args_hash/result_hash must be of the redacted payload: an
			// event hashing something else is refused.
			sum := sha256.Sum256([]byte(`{"token":"` + plantedToken + `"}`))
			m["args_hash"], m["args_ref"] = hex.EncodeToString(sum[:]), "sha256:"+hex.EncodeToString(sum[:])
		}, nil, "args_hash does not match payload"},
		{"result payload altered", func(m map[string]any) {
			m["payloads"].(map[string]any)["result"] = map[string]any{"content": []any{}, "isError": true}
		}, nil, "result_hash does not match payload"},
		{"args_ref names other content", func(m map[string]any) {
			m["args_ref"] = "sha256:" + strings.Repeat("0", 64)
		}, nil, "args_ref does not name the payload"},
		{"ref without payload names other content", func(m map[string]any) {
			delete(m["payloads"].(map[string]any), "result")
			m["result_ref"] = "sha256:" + strings.Repeat("0", 64)
		}, nil, "result_ref is not sha256:result_hash"},
		{"payload without hash", func(m map[string]any) {
			delete(m, "args_hash")
			delete(m, "args_ref")
		}, nil, "args_hash does not match payload: payload without a hash"},
		{"raw secret field", func(m map[string]any) { m["raw_args"] = plantedToken }, nil, "/data: additionalProperties"},
		{"all four", func(m map[string]any) {
			for _, f := range RequiredToolCallFields {
				delete(m, f)
			}
		}, RequiredToolCallFields, "required: missing"},
	}
	for _, f := range RequiredToolCallFields {
		cases = append(cases,
			struct {
				name    string
				mutate  mutation
				missing []string
				reason  string
			}{f + " absent", func(m map[string]any) { delete(m, f) }, []string{f}, "/data: required: missing " + f},
			struct {
				name    string
				mutate  mutation
				missing []string
				reason  string
			}{f + " empty", func(m map[string]any) { m[f] = "" }, []string{f}, "/data/" + f + ":"},
			struct {
				name    string
				mutate  mutation
				missing []string
				reason  string
			}{f + " null", func(m map[string]any) { m[f] = nil }, []string{f}, "/data/" + f + ": type"},
		)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := asMap(t, good)
			tc.mutate(m)
			_, _, err := ToolCallRowFromEvent(signed(t, key, callA, tcAt, m))
			var rej *RejectedToolCall
			if !errors.As(err, &rej) {
				t.Fatalf("want a *RejectedToolCall, got %v", err)
			}
			if !slices.Equal(rej.Missing, tc.missing) || !strings.Contains(rej.Reason, tc.reason) {
				t.Fatalf("missing %v reason %q; want %v and %q", rej.Missing, rej.Reason, tc.missing, tc.reason)
			}
			if strings.Contains(err.Error(), plantedToken) {
				t.Fatalf("the rejection echoes a value: %v", err)
			}
		})
	}

	// Not a ToolCallEvent at all: a dead letter, not a rejection.
	for name, raw := range map[string][]byte{
		"not json":     []byte("{"),
		"receipt type": []byte(`{"type":"dev.talos.receipt.decision.v1","data":{}}`),
		"no type":      []byte(`{"data":{}}`),
	} {
		_, _, err := ToolCallRowFromEvent(raw)
		var rej *RejectedToolCall
		if !errors.Is(err, ErrNotToolCallEvent) || errors.As(err, &rej) {
			t.Errorf("%s: err = %v, want ErrNotToolCallEvent", name, err)
		}
	}
}

// The payload as re-encoded on the way (not RFC 8785) still matches its
// hash once canonicalized, and the stored artifact is the canonical form.
func TestToolCallArtifactCanonicalized(t *testing.T) {
	key := testKey(t)
	ev := toolCallEvent(t, callA, tcAt)
	raw := signed(t, key, callA, tcAt, &ev)
	canonArgs := string(ev.Payloads.Args)
	spaced := strings.Replace(string(raw), canonArgs, `{ "token":"[REDACTED]", "path":"/work/a.txt", "headers": {"authorization":"[REDACTED]"} }`, 1)
	if spaced == string(raw) {
		t.Fatal("fixture: payload not found in the event")
	}
	_, arts, err := ToolCallRowFromEvent([]byte(spaced))
	if err != nil {
		t.Fatal(err)
	}
	if string(arts[0].Content) != canonArgs {
		t.Fatalf("artifact %s, want the canonical %s", arts[0].Content, canonArgs)
	}
}

func TestCompareToolCallColumns(t *testing.T) {
	key := testKey(t)
	ev := toolCallEvent(t, callA, tcAt)
	a, _, err := ToolCallRowFromEvent(signed(t, key, callA, tcAt, &ev))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		change func(*ToolCallRow)
		want   []string
	}{
		{"same", func(*ToolCallRow) {}, nil},
		{"inserted_at ignored", func(r *ToolCallRow) { r.InsertedAt = time.Now() }, nil},
		{"ok and pseudonyms", func(r *ToolCallRow) { r.OK = true; r.RedactionPseudonyms = []string{"x"} }, []string{"ok", "redaction_pseudonyms"}},
		{"started_at second", func(r *ToolCallRow) { r.StartedAt = r.StartedAt.Add(time.Second) }, []string{"started_at"}},
		{"urls dropped", func(r *ToolCallRow) { r.ResourcesURLs = nil }, []string{"resources_urls"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := a
			b.RedactionPseudonyms = slices.Clone(a.RedactionPseudonyms)
			tc.change(&b)
			if got := CompareToolCallColumns(b, a); !slices.Equal(got, tc.want) {
				t.Fatalf("CompareToolCallColumns = %v, want %v", got, tc.want)
			}
		})
	}
	empty := ToolCallRow{}
	withEmpty := ToolCallRow{ReasonCodes: []string{}, Flags: []string{}, RedactionRules: []string{}}
	if d := CompareToolCallColumns(empty, withEmpty); d != nil {
		t.Fatalf("nil vs empty arrays differ: %v", d)
	}
}

// The sink projects a ToolCallEvent into one tool_calls row with every
// FR-EVT-007 column filled and its two payloads in artifacts; a
// redelivery (same event, or a second event for the same call) shows once
// in v_tool_calls; events missing a required field, or whose payload does
// not match its hash, land in tool_call_rejections and nowhere in
// tool_calls; a record that is not a ToolCallEvent is a dead letter.
func TestSinkProjectsToolCalls(t *testing.T) {
	ctx, conn, db := migrated(t)
	key := testKey(t)
	ev := toolCallEvent(t, callA, tcAt)
	good := signed(t, key, callA, tcAt, &ev)
	second := signed(t, key, callA, tcAt.Add(time.Second), &ev) // same call, another event id
	subject := schemas.ToolCallEventSubject("files")

	recs := []schemas.AuditRecord{{Subject: subject, Data: good, StreamSeq: 1}}
	wantRejected := map[string][]string{} // event id -> missing
	seq := uint64(10)
	for _, f := range RequiredToolCallFields {
		m := asMap(t, toolCallEvent(t, "0190f5b2-7c1e-7a3b-8d4e-00000000000"+fmt.Sprint(seq-10), tcAt))
		delete(m, f)
		raw := signed(t, key, "call", tcAt, m)
		recs = append(recs, schemas.AuditRecord{Subject: subject, Data: raw, StreamSeq: seq})
		wantRejected[eventID(t, raw)] = []string{f}
		seq++
	}
	bad := asMap(t, toolCallEvent(t, "0190f5b2-7c1e-7a3b-8d4e-0000000000ff", tcAt))
	bad["payloads"].(map[string]any)["args"] = map[string]any{"token": plantedToken} // the raw payload, not the redacted one
	badRaw := signed(t, key, "call", tcAt, bad)
	recs = append(recs, schemas.AuditRecord{Subject: subject, Data: badRaw, StreamSeq: seq})
	wantRejected[eventID(t, badRaw)] = []string{}
	recs = append(recs, schemas.AuditRecord{Subject: subject, Data: []byte("not json"), StreamSeq: seq + 1})

	w := NewSinkWriter(conn, db)
	for i := 0; i < 2; i++ { // the second write is a sink redelivery
		if err := w.Write(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Write(ctx, []schemas.AuditRecord{{Subject: subject, Data: second, StreamSeq: 99}}); err != nil {
		t.Fatal(err)
	}

	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.tool_calls"); n != 3 {
		t.Fatalf("tool_calls has %d raw rows, want 3 (two copies of one event, one second event)", n)
	}
	calls, err := ToolCalls(ctx, conn, db, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 {
		t.Fatalf("v_tool_calls has %d rows, want 1: %+v", len(calls), calls)
	}
	got := calls[0]
	derived, _, err := ToolCallRowFromEvent(good)
	if err != nil {
		t.Fatal(err)
	}
	if d := CompareToolCallColumns(got, derived); d != nil {
		t.Fatalf("v_tool_calls row differs from its event (the first one) in %v", d)
	}
	// Every FR-EVT-007 column is filled.
	for name, v := range map[string]string{
		"trace_id": got.TraceID, "tool_call_id": got.ToolCallID, "tool_id": got.ToolID, "tool_version": got.ToolVersion,
		"transport": got.Transport, "side_effect": got.SideEffect, "idempotency": got.Idempotency,
		"idempotency_key": got.IdempotencyKey, "actor_kind": got.ActorKind, "agent_id": got.AgentID, "model_id": got.ModelID,
		"args_ref": got.ArgsRef, "args_hash": got.ArgsHash, "result_ref": got.ResultRef, "result_hash": got.ResultHash,
		"error_code": got.ErrorCode, "error_kind": got.ErrorKind, "error_message": got.ErrorMessage,
		"parent_span_id": got.ParentSpanID, "receipt_id": got.ReceiptID, "signer_kid": got.SignerKID,
	} {
		if v == "" {
			t.Errorf("column %s is empty", name)
		}
	}
	if got.StartedAtMS == 0 || got.EndedAtMS <= got.StartedAtMS || got.DurationMS != 77 || !got.ErrorRetryable ||
		len(got.CapabilityIDs) != 2 || len(got.ResourcesFiles) != 1 || len(got.ResourcesURLs) != 1 || len(got.RedactionPseudonyms) != 2 {
		t.Errorf("timing, capability, resources or redaction columns not filled: %+v", got)
	}

	arts, err := Artifacts(ctx, conn, db, []string{got.ArgsRef, got.ResultRef})
	if err != nil {
		t.Fatal(err)
	}
	if len(arts) != 2 {
		t.Fatalf("%d artifacts for args_ref/result_ref, want 2", len(arts))
	}
	for _, a := range arts {
		if "sha256:"+sha256Hex(a.Content) != a.Ref {
			t.Errorf("artifact %s: content hashes to %s", a.Ref, sha256Hex(a.Content))
		}
	}
	if sha256Hex(arts[0].Content) != got.ArgsHash && sha256Hex(arts[1].Content) != got.ArgsHash {
		t.Error("no artifact hashes to args_hash")
	}
	if n := count(t, ctx, conn, "SELECT uniqExact(ref) FROM `"+db+"`.artifacts"); n != 2 {
		t.Errorf("artifacts holds %d refs, want 2 (rejected events store none)", n)
	}

	rej, err := ToolCallRejections(ctx, conn, db, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rej) != len(wantRejected) {
		t.Fatalf("%d rejections, want %d: %+v", len(rej), len(wantRejected), rej)
	}
	for _, r := range rej {
		want, ok := wantRejected[r.EventID]
		if !ok || !slices.Equal(r.Missing, want) || r.Reason == "" || r.Subject != subject || r.StreamSeq < 10 || r.CloudEvent == "" {
			t.Errorf("rejection %+v; want missing %v", r, want)
		}
		if len(want) == 0 && !strings.Contains(r.Reason, "args_hash does not match payload") {
			t.Errorf("hash mismatch rejection reason %q", r.Reason)
		}
		if strings.Contains(r.Reason, plantedToken) {
			t.Error("a rejection reason echoes the payload")
		}
	}
	for id := range wantRejected {
		if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.tool_calls WHERE event_id = '"+id+"'"); n != 0 {
			t.Errorf("rejected event %s is in tool_calls", id)
		}
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.dead_letters"); n != 2 { // one record, written twice
		t.Errorf("%d dead letter rows, want 2", n)
	}
	// The mismatching payload (here the raw one) is not kept anywhere.
	for _, tbl := range []string{"tool_calls", "tool_call_rejections"} {
		if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`."+tbl+" WHERE position(cloudevent, '"+plantedToken+"') > 0"); n != 0 {
			t.Errorf("the raw secret is in %s", tbl)
		}
	}
	if n := count(t, ctx, conn, "SELECT count() FROM `"+db+"`.artifacts WHERE position(content, '"+plantedToken+"') > 0"); n != 0 {
		t.Error("the raw secret is in artifacts")
	}
}

func eventID(t testing.TB, raw []byte) string {
	t.Helper()
	var ce struct{ ID string }
	if err := json.Unmarshal(raw, &ce); err != nil || ce.ID == "" {
		t.Fatalf("no event id: %v", err)
	}
	return ce.ID
}

// An id-less ToolCallEvent is still kept (keyed by its stream sequence).
func TestRejectionOfEventWithoutID(t *testing.T) {
	r := RejectionOf(schemas.AuditRecord{Subject: "talos.audit.toolcall.x", StreamSeq: 42, Data: []byte(`{"type":"dev.talos.toolcall.v1","time":"bad"}`)},
		&RejectedToolCall{Missing: RequiredToolCallFields, Reason: "r"})
	if r.EventID != "stream-seq:42" || r.TimeMS != 0 || !r.Time.Equal(time.Unix(0, 0)) || len(r.Missing) != 4 {
		t.Fatalf("rejection = %+v", r)
	}
}

// SecretUses finds every call whose redactions carry the pseudonym, one row
// per call even when the secret was at several pointers, and nothing for
// another secret; v_redaction_counts counts rules per day.
func TestSecretUses(t *testing.T) {
	ctx, conn, db := migrated(t)
	key := testKey(t)
	w := NewSinkWriter(conn, db)
	other := pseudonymOf("rk1", "some-other-secret")
	var recs []schemas.AuditRecord
	for i, call := range []string{callA, "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f", "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d60"} {
		ev := toolCallEvent(t, call, tcAt.Add(time.Duration(i)*time.Minute))
		ev.Actor.AgentID = fmt.Sprintf("agent-%d", i)
		if i == 2 { // this call used another secret
			for j := range ev.Redactions {
				ev.Redactions[j].Pseudonym = other
			}
		}
		recs = append(recs, schemas.AuditRecord{Subject: schemas.ToolCallEventSubject("files"),
			Data: signed(t, key, call, tcAt.Add(time.Duration(i)*time.Minute), &ev), StreamSeq: uint64(i + 1)})
	}
	for i := 0; i < 2; i++ {
		if err := w.Write(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	uses, err := SecretUses(ctx, conn, db, pseudonymOf("rk1", plantedToken), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(uses) != 2 {
		t.Fatalf("%d uses, want 2: %+v", len(uses), uses)
	}
	for i, u := range uses {
		if u.ToolCallID != recsCall(t, recs[i]) || u.AgentID != fmt.Sprintf("agent-%d", i) || u.ServerID != "files" ||
			u.ToolName != "read_file" || u.Pointer != "/args/headers/authorization" || u.Rule != "bearer_header" ||
			!u.Time.Equal(tcAt.Add(time.Duration(i)*time.Minute)) {
			t.Errorf("use %d = %+v", i, u)
		}
	}
	// SecretUses reads tool_calls itself; it must answer as the view does.
	vrows, err := conn.Query(ctx, "SELECT tool_call_id, pointer, rule FROM `"+db+"`.v_secret_uses WHERE pseudonym = ? ORDER BY time_ms, tool_call_id",
		pseudonymOf("rk1", plantedToken))
	if err != nil {
		t.Fatal(err)
	}
	var fromView []string
	for vrows.Next() {
		var id, ptr, rule string
		if err := vrows.Scan(&id, &ptr, &rule); err != nil {
			t.Fatal(err)
		}
		fromView = append(fromView, id+" "+ptr+" "+rule)
	}
	vrows.Close()
	var fromQuery []string
	for _, u := range uses {
		fromQuery = append(fromQuery, u.ToolCallID+" "+u.Pointer+" "+u.Rule)
	}
	if !slices.Equal(fromView, fromQuery) {
		t.Errorf("v_secret_uses says %q, SecretUses %q", fromView, fromQuery)
	}
	if uses, err := SecretUses(ctx, conn, db, pseudonymOf("rk1", plantedToken), 1); err != nil || len(uses) != 1 {
		t.Errorf("limit 1: %d uses, %v", len(uses), err)
	}
	if uses, err := SecretUses(ctx, conn, db, pseudonymOf("rk2", plantedToken), 0); err != nil || len(uses) != 0 {
		t.Errorf("another key id: %d uses, %v", len(uses), err)
	}
	if uses, err := SecretUses(ctx, conn, db, other, 0); err != nil || len(uses) != 1 || uses[0].AgentID != "agent-2" {
		t.Errorf("other secret: %+v, %v", uses, err)
	}
	rows, err := conn.Query(ctx, "SELECT day, rule, redactions FROM `"+db+"`.v_redaction_counts ORDER BY rule")
	if err != nil {
		t.Fatal(err)
	}
	var counts []string
	for rows.Next() {
		var day time.Time
		var rule string
		var n uint64
		if err := rows.Scan(&day, &rule, &n); err != nil {
			t.Fatal(err)
		}
		counts = append(counts, fmt.Sprintf("%s %s %d", day.Format("2006-01-02"), rule, n))
	}
	rows.Close()
	if want := []string{"2026-05-06 bearer_header 3", "2026-05-06 github_token 3"}; !slices.Equal(counts, want) {
		t.Fatalf("v_redaction_counts = %q, want %q", counts, want)
	}
}

func recsCall(t testing.TB, r schemas.AuditRecord) string {
	t.Helper()
	var ce struct{ Subject string }
	json.Unmarshal(r.Data, &ce)
	return ce.Subject
}

// VerifyDatabase checks tool_calls too: a good event verifies, an altered
// column and a foreign signature are reported by event id.
func TestVerifyDatabaseToolCalls(t *testing.T) {
	ctx, conn, db := migrated(t)
	key, foreign := testKey(t), testKey(t)
	ev := toolCallEvent(t, callA, tcAt)
	good := signed(t, key, callA, tcAt, &ev)
	ev2 := toolCallEvent(t, "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f", tcAt)
	alien := signed(t, foreign, ev2.ToolCallID, tcAt, &ev2)
	w := NewSinkWriter(conn, db)
	// The decision receipt the events name is stored too.
	rec := decisionReceipt(t, receipts.NewChain("tc-test", key), ev.ReceiptID, callA, 1)
	if err := w.Write(ctx, []schemas.AuditRecord{rec, {Subject: "talos.audit.toolcall.files", Data: good, StreamSeq: 2}}); err != nil {
		t.Fatal(err)
	}
	keys := verify.KeySet{key.KID: key.Public()}
	rep, err := VerifyDatabase(ctx, conn, db, keys, false, nil)
	if err != nil || !rep.OK() {
		t.Fatalf("untampered: %v %v", rep.Problems, err)
	}
	if err := w.Write(ctx, []schemas.AuditRecord{{Subject: "talos.audit.toolcall.files", Data: alien, StreamSeq: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := MutateAndWait(ctx, conn, db, TableToolCalls, "UPDATE agent_id = 'someone-else' WHERE event_id = '"+eventID(t, good)+"'"); err != nil {
		t.Fatal(err)
	}
	rep, err = VerifyDatabase(ctx, conn, db, keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range rep.Problems {
		got[p.ReceiptID] = p.Kind + ": " + p.Detail
	}
	if len(got) != 2 || !strings.HasPrefix(got[eventID(t, good)], ProblemAlteredColumn+":") || !strings.HasSuffix(got[eventID(t, good)], ": agent_id") ||
		!strings.HasPrefix(got[eventID(t, alien)], verify.ProblemUnknownKey+":") {
		t.Fatalf("problems = %v", rep.Problems)
	}
	// With batch signatures, the same report.
	batch, err := VerifyDatabaseWith(ctx, conn, db, keys, VerifyOptions{BatchSignatures: true})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(batch, rep) {
		t.Fatalf("with batch signatures:\n%+v\nwithout:\n%+v", batch, rep)
	}
}

// decisionReceipt seals the next decision receipt of ch with the given
// CloudEvent id (id "" = a new one) for tool call tcid, as the sink gets it.
func decisionReceipt(t testing.TB, ch *receipts.Chain, id, tcid string, streamSeq uint64) schemas.AuditRecord {
	t.Helper()
	data := schemas.Receipt{EventType: schemas.KindDecision, Tool: "read_file", CapabilityHash: strings.Repeat("c", 64),
		AgentID: "agent-7", ToolID: "files/read_file", Timestamp: tcAt.Format(schemas.TimeFormat), ResultCode: "allow",
		ToolCallID: tcid, TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
		ServerID: "files", ToolName: "read_file", Phase: "pre", Mode: "prod", Decision: "allow", ReasonCodes: []string{},
		ToolClass: "read", DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg}
	s, err := ch.Seal(receipts.Meta{ID: id, Type: schemas.TypeReceiptDecision, Source: "talos://enforce/w1", Subject: tcid, Time: tcAt}, &data)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Commit(s); err != nil {
		t.Fatal(err)
	}
	return schemas.AuditRecord{Subject: "talos.audit.receipt.decision.files", Data: s.JSON, StreamSeq: streamSeq}
}

// Receipts carry capability_hash and capability_ids into their columns;
// a tampered capability_ids column is reported by VerifyDatabase.
func TestReceiptCapabilityColumns(t *testing.T) {
	ctx, conn, db := migrated(t)
	key := testKey(t)
	ch := receipts.NewChain("cap-test", key)
	var recs []schemas.AuditRecord
	var ids []string
	for i := 1; i <= 2; i++ {
		data := schemas.Receipt{EventType: schemas.KindDecision, Tool: "read_file", CapabilityHash: strings.Repeat("c", 64),
			AgentID: "agent-7", ToolID: "files/read_file", Timestamp: tcAt.Format(schemas.TimeFormat), ResultCode: "allow",
			ToolCallID: fmt.Sprintf("0190f5b2-7c1e-7a3b-8d4e-00000000000%d", i), TraceID: "4bf92f35-77b3-4da6-a3ce-929d0e0e4736",
			ServerID: "files", ToolName: "read_file", Phase: "pre", Mode: "prod", Decision: "allow", ReasonCodes: []string{},
			ToolClass: "read", DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg,
			CapabilityIDs: []string{"cap-root", fmt.Sprintf("cap-child-%d", i)}}
		s, err := ch.Seal(receipts.Meta{Type: schemas.TypeReceiptDecision, Source: "talos://enforce/w1", Subject: data.ToolCallID, Time: tcAt}, &data)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Commit(s); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, schemas.AuditRecord{Subject: "talos.audit.receipt.decision.files", Data: s.JSON, StreamSeq: uint64(i)})
		ids = append(ids, s.ID)
	}
	if err := NewSinkWriter(conn, db).Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	var stored []ReceiptRow
	if err := StreamReceipts(ctx, conn, db, func(r ReceiptRow) error { stored = append(stored, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(stored) != 2 {
		t.Fatalf("%d receipts, want 2", len(stored))
	}
	for i, r := range stored {
		if r.CapabilityHash != strings.Repeat("c", 64) || !slices.Equal(r.CapabilityIDs, []string{"cap-root", fmt.Sprintf("cap-child-%d", i+1)}) {
			t.Errorf("receipt %d: capability columns %q %q", i+1, r.CapabilityHash, r.CapabilityIDs)
		}
	}
	keys := verify.KeySet{key.KID: key.Public()}
	if rep, err := VerifyDatabase(ctx, conn, db, keys, false, nil); err != nil || !rep.OK() {
		t.Fatalf("untampered: %v %v", rep.Problems, err)
	}
	if err := MutateAndWait(ctx, conn, db, TableReceipts, "UPDATE capability_ids = ['cap-forged'] WHERE receipt_id = '"+ids[1]+"'"); err != nil {
		t.Fatal(err)
	}
	rep, err := VerifyDatabase(ctx, conn, db, keys, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 1 || rep.Problems[0].Kind != ProblemAlteredColumn || rep.Problems[0].ReceiptID != ids[1] ||
		!strings.HasSuffix(rep.Problems[0].Detail, ": capability_ids") {
		t.Fatalf("problems = %v", rep.Problems)
	}
}

// Migration 3 applies to a database at version 2 holding rows (which get
// empty new columns), is idempotent, and leaves every table and view
// queryable; a fresh database gets the same schema.
func TestMigration3FromVersion2(t *testing.T) {
	ctx, conn, db := migratedTo(t, 2)
	// A version-2 receipts row, written with version 2's columns.
	_, rows := chainOf(t, "v2", 1, t0)
	old := receiptInsertColumns[:slices.Index(receiptInsertColumns, "capability_hash")] // version 2's
	b, err := conn.PrepareBatch(ctx, "INSERT INTO `"+db+"`.receipts ("+strings.Join(old, ", ")+")")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Append(rows[0].insertValues()[:len(old)]...); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := Migrate(ctx, conn, db); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	fresh := db + "_fresh"
	t.Cleanup(func() { conn.Exec(context.Background(), "DROP DATABASE IF EXISTS `"+fresh+"`") })
	if err := Migrate(ctx, conn, fresh); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{db, fresh} {
		if v, err := AppliedVersion(ctx, conn, name); err != nil || v != SchemaVersion() {
			t.Fatalf("%s: AppliedVersion = %d, %v; want %d", name, v, err, SchemaVersion())
		}
		for _, obj := range []string{TableToolCallRejections, ViewToolCalls, ViewSecretUses, ViewRedactionCounts} {
			count(t, ctx, conn, "SELECT count() FROM `"+name+"`.`"+obj+"`")
		}
		var cols []string
		r, err := conn.Query(ctx, "SELECT table || '.' || name FROM system.columns WHERE database = ? AND table IN ('receipts', 'tool_calls') ORDER BY table, name", name)
		if err != nil {
			t.Fatal(err)
		}
		for r.Next() {
			var c string
			r.Scan(&c)
			cols = append(cols, c)
		}
		r.Close()
		for _, want := range append(prefixed("receipts.", receiptInsertColumns), prefixed("tool_calls.", toolCallInsertColumns)...) {
			if !slices.Contains(cols, want) {
				t.Errorf("%s: column %s missing", name, want)
			}
		}
	}
	var stored []ReceiptRow
	if err := StreamReceipts(ctx, conn, db, func(r ReceiptRow) error { stored = append(stored, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 || stored[0].CapabilityHash != "" || len(stored[0].CapabilityIDs) != 0 {
		t.Fatalf("version-2 row after migration: %+v", stored)
	}
	if d := CompareColumns(stored[0], rows[0]); d != nil {
		t.Fatalf("version-2 row changed in %v", d)
	}
}

func prefixed(p string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = p + n
	}
	return out
}

func FuzzToolCallRowFromEvent(f *testing.F) {
	key := testKey(f)
	ev := toolCallEvent(f, callA, tcAt)
	f.Add(signed(f, key, callA, tcAt, &ev))
	m := asMap(f, ev)
	delete(m, "tool_version")
	f.Add(signed(f, key, callA, tcAt, m))
	f.Add([]byte(`{"type":"dev.talos.toolcall.v1","data":{"payloads":{"args":1}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		row, arts, err := ToolCallRowFromEvent(raw)
		var rej *RejectedToolCall
		if errors.As(err, &rej) {
			r := RejectionOf(schemas.AuditRecord{Data: raw, StreamSeq: 1}, rej)
			if r.EventID == "" || strings.Contains(r.CloudEvent, `"payloads"`) && !strings.Contains(string(raw), `"payloads"`) {
				t.Fatalf("bad rejection %+v", r)
			}
			return
		}
		if err != nil {
			return
		}
		if row.CloudEvent != string(raw) || row.ToolCallID == "" || row.TraceID == "" || row.ToolID == "" || row.ToolVersion == "" {
			t.Fatalf("accepted with bad row %+v", row)
		}
		for _, a := range arts {
			if a.Ref != "sha256:"+sha256Hex(a.Content) || (a.Ref != row.ArgsRef && a.Ref != row.ResultRef) {
				t.Fatalf("artifact %s does not match its content or the row", a.Ref)
			}
		}
		if d := CompareToolCallColumns(row, row); d != nil {
			t.Fatalf("row differs from itself: %v", d)
		}
	})
}

// publishedToolCallEvents are ToolCallEvents as workers sign them (RFC
// 8785): a post event with both payloads, error and resources, the
// benchmark's 2 KB call, and a minimal denied pre event.
func publishedToolCallEvents(t testing.TB) map[string][]byte {
	t.Helper()
	key := testKey(t)
	full := toolCallEvent(t, callA, tcAt)
	full.Error.Message = "partial read: \"a.txt\"\n"
	min := schemas.ToolCallEvent{Type: schemas.ToolCallEventKind, TraceID: full.TraceID, ToolCallID: callA, ToolID: "files/rm",
		ToolVersion: schemas.UnregisteredToolVersion, Transport: "local", SideEffect: "WRITE", Idempotency: "NON_IDEMPOTENT",
		Actor: schemas.Actor{Kind: "system"}, Timing: full.Timing, Phase: "pre", Decision: "deny",
		ReasonCodes: []string{"TOOL_UNCLASSIFIED_DENIED"}, ReceiptID: full.ReceiptID, Redactions: []schemas.Redaction{}}
	refsOnly := toolCallEvent(t, callA, tcAt) // payloads not stored, refs kept
	refsOnly.Payloads = nil
	server := toolCallEvent(t, callA, tcAt) // a server request, linked to its call
	server.ToolName, server.MCPMethod, server.ParentToolCallID = schemas.MethodRootsList, schemas.MethodRootsList, full.TraceID
	return map[string][]byte{
		"server request": signed(t, key, callA, tcAt, &server),
		"full":           signed(t, key, callA, tcAt, &full),
		"refs only":      signed(t, key, callA, tcAt, &refsOnly),
		"bench":          newSinkMaker(t).next(t, 1).toolCall.Data,
		"minimal":        signed(t, key, callA, tcAt, &min),
	}
}

// checkToolCallFastPath holds toolCallRowFast to toolCallRowValidated on
// raw (schema validation, then encoding/json): if the fast path takes raw,
// the general path must accept it with the same row and artifacts. It
// reports whether the fast path took raw.
func checkToolCallFastPath(t *testing.T, raw []byte) bool {
	t.Helper()
	fast, fastArts, ok := toolCallRowFast(raw, string(raw), nil)
	if !ok {
		return false
	}
	slow, slowArts, err := toolCallRowValidated(raw, string(raw))
	switch {
	case err != nil:
		t.Errorf("fast path took an event the general path refuses (%v):\n%s", err, raw)
	case !reflect.DeepEqual(fast, slow):
		t.Errorf("fast path row differs:\nfast %+v\nslow %+v\n%s", fast, slow, raw)
	case !reflect.DeepEqual(fastArts, slowArts):
		t.Errorf("fast path artifacts differ:\nfast %+v\nslow %+v\n%s", fastArts, slowArts, raw)
	}
	return true
}

// The fast path takes every published ToolCallEvent, and takes no variant
// of them that the schema validator, the decoder or the payload checks
// refuse, deriving the same row and artifacts from those it takes.
func TestToolCallRowFastPathMatchesValidator(t *testing.T) {
	checkFastPathVariants(t, publishedToolCallEvents(t), func(string) bool { return true }, checkToolCallFastPath)
}

func FuzzToolCallRowFastPath(f *testing.F) {
	fuzzFastPath(f, publishedToolCallEvents(f), checkToolCallFastPath)
}

// Each matcher of a schema pattern agrees with the pattern itself, read
// from the embedded schema, on near misses of a matching string.
func TestToolCallMatchersAgreeWithSchema(t *testing.T) {
	docs := map[string]map[string]any{}
	for _, f := range []string{schemas.FileToolCallEventSchema, schemas.FileToolEffectSchema, schemas.FileReceiptSchema} {
		b, err := fs.ReadFile(schemas.SchemaFS(), f)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		docs[f] = m
	}
	// pattern follows a path of keys in one schema document.
	pattern := func(file string, path ...string) string {
		var v any = docs[file]
		for _, k := range path {
			v = v.(map[string]any)[k]
		}
		return v.(string)
	}
	ev := schemas.FileToolCallEventSchema
	hex64 := strings.Repeat("0123456789abcdef", 4)
	for _, tc := range []struct {
		name    string
		pattern string
		match   func(string) bool
		example string
	}{
		{"uuid", pattern(ev, "$defs", "uuid", "pattern"), isUUID, "4bf92f35-77B3-4da6-a3ce-929d0e0e4736"},
		{"uuidv7", pattern(schemas.FileToolEffectSchema, "$defs", "uuidv7", "pattern"), isUUIDv7, "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e"},
		{"hex256", pattern(ev, "$defs", "hex256", "pattern"), isHex64, hex64},
		{"ref", pattern(ev, "$defs", "ref", "pattern"), isRef, "sha256:" + hex64},
		{"id_or_empty", pattern(ev, "$defs", "id_or_empty", "pattern"), isIDOrEmpty, "files_1-a"},
		{"code", pattern(ev, "$defs", "code", "pattern"), isReasonCode, "TOOL_UNCLASSIFIED-DENIED9"},
		{"flag", pattern(ev, "$defs", "event", "properties", "flags", "items", "pattern"), isFlag, "post_without_pre2"},
		{"pointer", pattern(ev, "$defs", "redaction", "properties", "pointer", "pattern"), isRedactionPointer, "/args/a~0b/~1c//d"},
		{"pseudonym", pattern(ev, "$defs", "redaction", "properties", "pseudonym", "pattern"), isPseudonym, "hmac-sha256:rk1:" + hex64},
		{"sig", pattern(schemas.FileReceiptSchema, "$defs", "signature", "properties", "sig", "pattern"), isSignatureValue, strings.Repeat("Az09_-", 14) + "ab"},
		{"source", pattern(ev, "properties", "source", "pattern"), isTalosSource, "talos://enforce/w-1/x"},
	} {
		re := regexp.MustCompile(tc.pattern)
		if !tc.match(tc.example) || !re.MatchString(tc.example) {
			t.Errorf("%s: example %q: matcher %v, pattern %v", tc.name, tc.example, tc.match(tc.example), re.MatchString(tc.example))
			continue
		}
		for _, s := range nearMisses(tc.example) {
			if got, want := tc.match(s), re.MatchString(s); got != want {
				t.Errorf("%s: %q: matcher %v, pattern %s says %v", tc.name, s, got, tc.pattern, want)
			}
		}
	}
}

// nearMisses are s with each byte replaced or doubled, each run of up to
// four bytes removed, s truncated and extended, with characters from every
// class the patterns name.
func nearMisses(s string) []string {
	subst := []string{"", "0", "9", "a", "f", "g", "z", "A", "F", "G", "Z", "-", "_", "/", "~", ":", " ", "\t", "\n", "\v", "é", "ſ", ".", "7", "8", "b", "c"}
	out := []string{"", s + s}
	for i := 0; i <= len(s); i++ {
		for n := 2; n <= 4 && i+n <= len(s); n++ {
			out = append(out, s[:i]+s[i+n:])
		}
		for _, c := range subst {
			out = append(out, s[:i]+c+s[i:])
			if i < len(s) {
				out = append(out, s[:i]+c+s[i+1:])
			}
		}
		out = append(out, s[:i])
	}
	return out
}
