package query

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gowebpki/jcs"

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
