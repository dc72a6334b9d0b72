package schemas

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

var decisionSamples = []string{
	`{"tool_call_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","phase":"pre","decision":"allow","reason_codes":[],"receipt_id":"r","registry_digest":"sha256:ab","receipt":{"data":{"a":[1,-2.5e3,true,false,null,"x\"y\\\u00e9"]},"id":"r"}}`,
	`{"tool_call_id":"t","phase":"post","decision":"deny","reason_codes":["KILL_SWITCH","REPLAY"],"receipt_id":"","registry_digest":"","receipt":null,"details":["a","b"]}`,
	`{"tool_call_id":"t","phase":"pre","decision":"deny","reason_codes":null,"receipt_id":"r","registry_digest":"d","receipt":{}}`,
	`{"tool_call_id":"t\u00e9","phase":"pre"}`,
	`{"decision":"allow","decision":"deny"}`,
	`{"unknown":1,"phase":"pre"}`,
	`{"phase":"pre","receipt":[1,{"a":{}}],"details":[]}`,
	`{}`,
	` {"phase":"pre"}`,
	`{"phase":"pre"} `,
	`{"phase":"pre",}`,
	`{"phase":"pre","receipt":{"a":"\x01"}}`,
	"{\"phase\":\"\xff\"}",
	`{"phase":"pre","receipt":01}`,
	`{"phase":"pre","receipt":-}`,
	`[]`,
	`null`,
	``,
}

// TestParseDecisionMatchesUnmarshal: ParseDecision answers as
// json.Unmarshal into a Decision does, and its fast path takes what
// workers send.
func TestParseDecisionMatchesUnmarshal(t *testing.T) {
	for _, s := range decisionSamples {
		checkParseDecision(t, []byte(s))
	}
	if _, ok := parseDecisionFast([]byte(decisionSamples[0])); !ok {
		t.Error("the fast path declined a worker's decision")
	}
	if _, ok := parseDecisionFast([]byte(decisionSamples[1])); !ok {
		t.Error("the fast path declined a deny with details")
	}
}

func FuzzParseDecision(f *testing.F) {
	for _, s := range decisionSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkParseDecision(t, b) })
}

func checkParseDecision(t *testing.T, b []byte) {
	t.Helper()
	var want Decision
	werr := json.Unmarshal(b, &want)
	got, err := ParseDecision(b)
	if (err != nil) != (werr != nil) {
		t.Fatalf("%q: ParseDecision error %v, json.Unmarshal %v", b, err, werr)
	}
	if err == nil && !reflect.DeepEqual(*got, want) {
		t.Fatalf("%q:\n got %#v\nwant %#v", b, *got, want)
	}
}

// BenchmarkParseDecision is an enforcement point reading one decision
// reply whose receipt is a signed CloudEvent of typical size.
func BenchmarkParseDecision(b *testing.B) {
	hex := strings.Repeat("0123456789abcdef", 4)
	receipt := `{"data":{"agent_id":"agent-1","chain":{"chain_id":"w1-3","prev_hash":"` + hex + `","seq":42},` +
		`"decision":"allow","envelope_hash":"` + hex + `","ep_id":"gw-1","phase":"pre","reason_codes":[],` +
		`"registry_digest":"sha256:` + hex + `","request_hash":"` + hex + `","server_id":"files","session_id":"s-1",` +
		`"signature":{"alg":"Ed25519","kid":"0123456789abcdef","sig":"` + strings.Repeat("A", 86) + `"},` +
		`"tool_call_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","tool_name":"read_file"},` +
		`"datacontenttype":"application/json","id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f","source":"talos://enforce/w1",` +
		`"specversion":"1.0","subject":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","time":"2025-01-02T03:04:05.678Z","type":"talos.receipt.decision"}`
	raw := []byte(`{"tool_call_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6e","phase":"pre","decision":"allow","reason_codes":[],` +
		`"receipt_id":"0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6f","registry_digest":"sha256:` + hex + `","receipt":` + receipt + `}`)
	if _, ok := parseDecisionFast(raw); !ok {
		b.Fatal("fast path declined")
	}
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseDecision(raw); err != nil {
			b.Fatal(err)
		}
	}
}
