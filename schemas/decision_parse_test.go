package schemas

import (
	"encoding/json"
	"reflect"
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
