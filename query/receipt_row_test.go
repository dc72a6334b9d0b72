package query

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gowebpki/jcs"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/schemas"
)

// testReceipt describes one hand-made receipt CloudEvent.
type testReceipt struct {
	id       string
	kind     string
	call     string
	phase    string
	decision string
	codes    []string
	server   string
	chain    string
	seq      uint64
	prev     string
	at       time.Time
	capHash  string   // data.capability_hash
	caps     []string // data.capability_ids (omitted when nil)
}

func (r testReceipt) unsigned() map[string]any {
	codes := r.codes
	if codes == nil {
		codes = []string{}
	}
	ev := map[string]any{
		"specversion":     "1.0",
		"id":              r.id,
		"source":          "talos://enforce/w1",
		"type":            "dev.talos.receipt." + r.kind + ".v1",
		"subject":         r.call,
		"time":            r.at.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		"datacontenttype": "application/json",
		"data": map[string]any{
			"event_type":        r.kind,
			"tool":              "read_file",
			"capability_hash":   r.capHash,
			"request_hash":      strings.Repeat("a", 64),
			"response_hash":     "",
			"agent_id":          "agent-7",
			"tool_id":           r.server + "/read_file",
			"timestamp":         r.at.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
			"result_code":       r.decision,
			"envelope_hash":     strings.Repeat("e", 64),
			"tool_call_id":      r.call,
			"trace_id":          "0190a1b2-0000-7000-8000-000000000001",
			"correlation_id":    "c29tZS1yYW5kb20tYnl0ZXMtaGVyZQ",
			"session_id":        "sess-1",
			"ep_id":             "gw-1",
			"server_id":         r.server,
			"tool_name":         "read_file",
			"phase":             r.phase,
			"mode":              "prod",
			"decision":          r.decision,
			"reason_codes":      codes,
			"tool_class":        "read",
			"registry_digest":   "sha256:" + strings.Repeat("d", 64),
			"document_hashes":   []any{},
			"batch_total_bytes": 0,
			"content_hash_alg":  "sha256",
			"chain":             map[string]any{"chain_id": r.chain, "seq": r.seq, "prev_hash": r.prev},
		},
	}
	if r.caps != nil {
		ev["data"].(map[string]any)["capability_ids"] = r.caps
	}
	return ev
}

// event returns the signed JSON (with a dummy signature: nothing here
// verifies it) and the receipt hash computed independently of the code
// under test.
func (r testReceipt) event(t testing.TB) (raw []byte, hash string) {
	t.Helper()
	ev := r.unsigned()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	canon, err := jcs.Transform(b)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(canon)
	ev["data"].(map[string]any)["signature"] = map[string]any{"alg": "Ed25519", "kid": "key-1", "sig": "c2ln"}
	raw, err = json.MarshalIndent(ev, "", " ") // not canonical on purpose
	if err != nil {
		t.Fatal(err)
	}
	return raw, hex.EncodeToString(sum[:])
}

// chainOf builds n linked receipts on one chain; every third is a deny.
func chainOf(t testing.TB, chain string, n int, start time.Time) (raws [][]byte, rows []ReceiptRow) {
	t.Helper()
	prev := schemas.GenesisHash
	for i := 1; i <= n; i++ {
		r := testReceipt{
			id: fmt.Sprintf("0190a1b2-%04x-7000-8000-%012d", i%0xffff, i), kind: "decision",
			call: fmt.Sprintf("0190a1b2-0000-4000-8000-%012d", i), phase: "pre", decision: "allow",
			server: "files", chain: chain, seq: uint64(i), prev: prev, at: start.Add(time.Duration(i) * time.Millisecond),
		}
		if i%3 == 0 {
			r.decision, r.codes = "deny", []string{"TOOL_UNCLASSIFIED_DENIED", "UNKNOWN_TOOL"}
		}
		raw, hash := r.event(t)
		row, err := ReceiptRowFromEvent(raw)
		if err != nil {
			t.Fatal(err)
		}
		if row.ReceiptHash != hash {
			t.Fatalf("receipt %d: hash %s, want %s", i, row.ReceiptHash, hash)
		}
		prev = hash
		raws, rows = append(raws, raw), append(rows, row)
	}
	return raws, rows
}

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 890_000_000, time.UTC)

func TestReceiptRowFromEvent(t *testing.T) {
	r := testReceipt{id: "0190a1b2-0000-7000-8000-000000000009", kind: "decision",
		call: "0190a1b2-0000-4000-8000-000000000009", phase: "pre", decision: "deny",
		codes: []string{"REPLAY", "EXPIRED"}, server: "files", chain: "w1-0", seq: 7,
		prev: strings.Repeat("f", 64), at: t0, capHash: strings.Repeat("c", 64), caps: []string{"cap-root", "cap-leaf"}}
	raw, hash := r.event(t)
	got, err := ReceiptRowFromEvent(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := ReceiptRow{
		ReceiptID: r.id, Kind: "decision", Phase: "pre", Time: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC),
		TimeMS: uint64(t0.UnixMilli()), ToolCallID: r.call, TraceID: "0190a1b2-0000-7000-8000-000000000001",
		SessionID: "sess-1", EPID: "gw-1", ServerID: "files", ToolName: "read_file", ToolClass: "read",
		Decision: "deny", ReasonCodes: []string{"REPLAY", "EXPIRED"}, AgentID: "agent-7",
		RequestHash: strings.Repeat("a", 64), EnvelopeHash: strings.Repeat("e", 64),
		RegistryDigest: "sha256:" + strings.Repeat("d", 64), ChainID: "w1-0", ChainSeq: 7,
		PrevHash: strings.Repeat("f", 64), ReceiptHash: hash, SignerKID: "key-1", CloudEvent: string(raw),
		CapabilityHash: strings.Repeat("c", 64), CapabilityIDs: []string{"cap-root", "cap-leaf"},
	}
	if d := CompareColumns(got, want); d != nil {
		t.Fatalf("columns differ: %v\ngot  %+v\nwant %+v", d, got, want)
	}
	if !got.Time.Equal(want.Time) {
		t.Fatalf("time = %v, want %v", got.Time, want.Time)
	}

	// The hash ignores formatting and data.signature.
	var compact map[string]any
	json.Unmarshal(raw, &compact)
	compact["data"].(map[string]any)["signature"] = map[string]any{"alg": "Ed25519", "kid": "key-2", "sig": "b3RoZXI"}
	raw2, _ := json.Marshal(compact)
	got2, err := ReceiptRowFromEvent(raw2)
	if err != nil {
		t.Fatal(err)
	}
	if got2.ReceiptHash != hash || got2.SignerKID != "key-2" {
		t.Fatalf("re-signed copy: hash %s kid %s, want %s key-2", got2.ReceiptHash, got2.SignerKID, hash)
	}
}

func TestReceiptRowFromEventRejects(t *testing.T) {
	ok := testReceipt{id: "id-1", kind: "effect", call: "c", phase: "post", decision: "allow", server: "s", chain: "c", seq: 1, at: t0}
	good, _ := ok.event(t)
	if row, err := ReceiptRowFromEvent(good); err != nil || row.Kind != "effect" {
		t.Fatalf("good effect receipt: kind %q err %v", row.Kind, err)
	}
	replace := func(old, new string) []byte { return []byte(strings.Replace(string(good), old, new, 1)) }
	for _, tc := range []struct {
		name    string
		raw     []byte
		notRcpt bool
	}{
		{"not json", []byte("{"), false},
		{"toolcall type", replace(`"dev.talos.receipt.effect.v1"`, `"dev.talos.toolcall.v1"`), true},
		{"bad version", replace(`"dev.talos.receipt.effect.v1"`, `"dev.talos.receipt.effect.v2"`), true},
		{"no id", replace(`"id": "id-1"`, `"id": ""`), true},
		{"bad time", replace(`"time": "2026`, `"time": "x2026`), false},
		{"duplicate key", replace(`"decision": "allow"`, `"decision": "deny", "decision": "allow"`), false},
		{"data not object", replace(`"data": {`, `"data": 5, "x": {`), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReceiptRowFromEvent(tc.raw)
			if err == nil {
				t.Fatal("accepted")
			}
			if errors.Is(err, ErrNotReceipt) != tc.notRcpt {
				t.Fatalf("errors.Is(ErrNotReceipt) = %v for %v", !tc.notRcpt, err)
			}
		})
	}
}

func TestCompareColumns(t *testing.T) {
	_, rows := chainOf(t, "c", 1, t0)
	a := rows[0]
	for _, tc := range []struct {
		name   string
		change func(*ReceiptRow)
		want   []string
	}{
		{"same", func(*ReceiptRow) {}, nil},
		{"nil codes equal empty", func(r *ReceiptRow) { r.ReasonCodes = nil }, nil},
		{"inserted_at ignored", func(r *ReceiptRow) { r.InsertedAt = time.Now() }, nil},
		{"decision", func(r *ReceiptRow) { r.Decision = "deny" }, []string{"decision"}},
		{"codes and seq", func(r *ReceiptRow) { r.ReasonCodes = []string{"X"}; r.ChainSeq = 9 }, []string{"reason_codes", "chain_seq"}},
		{"time second", func(r *ReceiptRow) { r.Time = r.Time.Add(time.Second) }, []string{"time"}},
		{"nil capability ids equal empty", func(r *ReceiptRow) { r.CapabilityIDs = nil }, nil},
		{"capability columns", func(r *ReceiptRow) { r.CapabilityHash = "x"; r.CapabilityIDs = []string{"cap-forged"} },
			[]string{"capability_hash", "capability_ids"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := a
			b.ReasonCodes = slices.Clone(a.ReasonCodes)
			tc.change(&b)
			if got := CompareColumns(b, a); !slices.Equal(got, tc.want) {
				t.Fatalf("CompareColumns = %v, want %v", got, tc.want)
			}
		})
	}
}

func FuzzReceiptRowFromEvent(f *testing.F) {
	raws, _ := chainOf(f, "c", 2, t0)
	for _, r := range raws {
		f.Add(r)
	}
	f.Add([]byte(`{"id":"x","type":"dev.talos.receipt.decision.v1","time":"2026-01-01T00:00:00Z","data":{}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		row, err := ReceiptRowFromEvent(raw)
		if err != nil {
			return
		}
		if len(row.ReceiptHash) != 64 || row.ReceiptID == "" || row.Kind == "" || row.CloudEvent != string(raw) {
			t.Fatalf("accepted with bad row %+v", row)
		}
		if d := CompareColumns(row, row); d != nil {
			t.Fatalf("row differs from itself: %v", d)
		}
	})
}

// publishedReceipts are receipts as workers and the control service seal
// them (RFC 8785), one of each shape the sink meets.
func publishedReceipts(t testing.TB) map[string][]byte {
	t.Helper()
	fx := newSinkMaker(t).next(t, 1)
	out := map[string][]byte{"decision": fx.decision.Data, "effect": fx.effect.Data}
	key := testKey(t)
	ch := receipts.NewChain("shapes-0", key)
	seal := func(name, typ string, r *schemas.Receipt) {
		s, err := ch.Seal(receipts.Meta{Type: typ, Source: "talos://enforce/w1", Subject: "s", Time: t0}, r)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch.Commit(s); err != nil {
			t.Fatal(err)
		}
		out[name] = s.JSON
	}
	seal("deny", schemas.TypeReceiptDecision, &schemas.Receipt{EventType: schemas.KindDecision, Decision: schemas.DecisionDeny,
		ReasonCodes: []string{"KILL_SWITCH", "REPLAY"}, ToolCallID: "0190a1b2-0000-4000-8000-000000000001",
		IdempotentOf: &schemas.IdempotentOf{ToolCallID: "0190a1b2-0000-4000-8000-000000000000"}, Mode: "prod",
		Tool: "tool with \"quotes\" and ü", ContentHashAlg: schemas.ContentHashAlg,
		UpstreamSandbox: &schemas.UpstreamSandbox{Sandboxed: true, Network: schemas.SandboxNetworkAllowlist, AllowlistSHA256: "sha256:" + strings.Repeat("ab", 32)}})
	seal("server request", schemas.TypeReceiptDecision, &schemas.Receipt{EventType: schemas.KindDecision, Decision: schemas.DecisionAllow,
		ReasonCodes: []string{}, ToolCallID: "0190a1b2-0000-4000-8000-000000000002", ToolName: schemas.MethodSamplingCreateMessage,
		MCPMethod: schemas.MethodSamplingCreateMessage, ParentToolCallID: "0190a1b2-0000-4000-8000-000000000001", Mode: "prod"})
	seal("control", schemas.TypeReceiptControl, &schemas.Receipt{EventType: schemas.KindControl, Tool: "killswitch.set",
		Control: &schemas.ControlRecord{CommandID: "c1", Verb: "killswitch.set", Actor: "alice", Accepted: true, Seq: 9}})
	return out
}

// checkReceiptFastPath holds receiptRowFast to receiptRowDecoded on raw: if
// the fast path takes raw, the decoder must accept it and derive the same
// row. It reports whether the fast path took raw.
func checkReceiptFastPath(t *testing.T, raw []byte) bool {
	t.Helper()
	fast, ok := receiptRowFast(raw, string(raw))
	if !ok {
		return false
	}
	slow, ctl, err := receiptRowDecoded(raw, string(raw))
	switch {
	case err != nil:
		t.Errorf("fast path took a receipt the decoder refuses (%v):\n%s", err, raw)
	case ctl != nil:
		t.Errorf("fast path took a receipt with data.control:\n%s", raw)
	case !reflect.DeepEqual(fast, slow):
		t.Errorf("fast path row differs:\nfast %+v\nslow %+v\n%s", fast, slow, raw)
	}
	return true
}

// The fast path takes every published receipt but a control one, and
// derives what the general decoder derives from every variant of them it
// takes.
func TestReceiptRowFastPathMatchesDecoder(t *testing.T) {
	checkFastPathVariants(t, publishedReceipts(t), func(name string) bool { return name != "control" }, checkReceiptFastPath)
}

// Small receipts put data.signature first, last and alone in data, and
// data first and last in the event: the receipt hash removes the member
// and one comma next to it wherever it is.
func edgeReceipts() []string {
	const head = `"id":"r1","time":"2026-03-04T05:06:07.890Z","type":"dev.talos.receipt.decision.v1"`
	const sig = `"signature":{"alg":"Ed25519","kid":"k1","sig":"c2ln"}`
	return []string{
		`{"data":{` + sig + `},` + head + `}`,
		`{"data":{` + sig + `,"tool_call_id":"c1"},` + head + `}`,
		`{"data":{"agent_id":"a",` + sig + `},` + head + `}`,
		`{"data":{"agent_id":"a",` + sig + `,"tool_call_id":"c1"},` + head + `,"zz":[{}]}`,
		`{"data":{"agent_id":"a",` + strings.Replace(sig, `{"alg"`, `{"Alg":1,"alg"`, 1) + `},` + head + `}`,
		`{"data":{"signature":null},` + head + `}`,
	}
}

func TestReceiptRowFastPathEdges(t *testing.T) {
	for i, doc := range edgeReceipts() {
		want := i != 4 // "Alg" folds to alg: the decoder would read it
		if got := checkReceiptFastPath(t, []byte(doc)); got != want {
			t.Errorf("%s: fast path took it: %v, want %v", doc, got, want)
		}
	}
}

func FuzzReceiptRowFastPath(f *testing.F) {
	for _, doc := range edgeReceipts() {
		f.Add([]byte(doc))
	}
	fuzzFastPath(f, publishedReceipts(f), checkReceiptFastPath)
}

// The fast path knows every member the general path decodes into
// schemas.Receipt and the structs under it, so that it type-checks each
// one as encoding/json would and leaves a key folding to one of them to
// the general path.
func TestReceiptFastPathKnowsReceiptFields(t *testing.T) {
	tags := func(v any) []string {
		var out []string
		for f := range reflect.TypeOf(v).Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			out = append(out, name)
		}
		slices.Sort(out)
		return out
	}
	checked := func(fs []checkedField) []string {
		var out []string
		for _, f := range fs {
			out = append(out, f.name)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		have []string
		want []string
	}{
		{"data", receiptDataNames, tags(schemas.Receipt{})},
		{"chain", chainNames, tags(schemas.Chain{})},
		{"signature", signatureNames, tags(schemas.Signature{})},
		{"document_hashes", checked(documentHashFields), tags(schemas.DocumentHash{})},
		{"effect", checked(effectFields), tags(schemas.ToolEffect{})},
		{"idempotent_of", checked(idempotentOfFields), tags(schemas.IdempotentOf{})},
		{"token_handling", checked(tokenHandlingFields), tags(schemas.TokenHandling{})},
		{"upstream_sandbox", checked(upstreamSandboxFields), tags(schemas.UpstreamSandbox{})},
	} {
		have := slices.Sorted(slices.Values(tc.have))
		if !slices.Equal(have, tc.want) {
			t.Errorf("%s: fast path knows %v, schemas has %v", tc.name, have, tc.want)
		}
	}
}
