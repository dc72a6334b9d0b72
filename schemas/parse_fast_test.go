package schemas

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// spanOffset is the offset in raw at which span starts, or -1 if span does
// not alias raw (or is empty).
func spanOffset(raw, span []byte) int {
	if len(span) == 0 {
		return -1
	}
	for i := range raw {
		if &raw[i] == &span[0] {
			return i
		}
	}
	return -1
}

// sameSpan fails unless got and want are the same bytes at the same place
// of raw (or both absent), with no capacity beyond their length.
func sameSpan(t testing.TB, what string, raw, got, want []byte) {
	t.Helper()
	if (got == nil) != (want == nil) || string(got) != string(want) {
		t.Fatalf("%s: got %q, reference %q", what, got, want)
	}
	if got == nil {
		return
	}
	if g, w := spanOffset(raw, got), spanOffset(raw, want); g != w || g < 0 {
		t.Fatalf("%s: at offset %d, reference at %d", what, g, w)
	}
	if cap(got) != len(got) {
		t.Fatalf("%s: capacity %d beyond length %d", what, cap(got), len(got))
	}
}

// checkSameAsReference fails unless ParseToolCall and
// parseToolCallReference give the same result for raw under lim: the same
// *ValidationError, or ParsedCalls with equal Call, Doc, Raw and spans. It
// also holds the one-pass decoder and the quick schema check to their
// contracts on raw, and reports whether the envelope was accepted.
func checkSameAsReference(t testing.TB, raw []byte, lim Limits) bool {
	t.Helper()
	got, gotErr := ParseToolCall(raw, lim)
	want, wantErr := parseToolCallReference(raw, lim)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("ParseToolCall error %v, reference error %v", gotErr, wantErr)
	}
	if gotErr != nil {
		var g, w *ValidationError
		if !errors.As(gotErr, &g) || !errors.As(wantErr, &w) {
			t.Fatalf("not ValidationErrors: %v / %v", gotErr, wantErr)
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("ParseToolCall error\n %#v\nreference error\n %#v", g, w)
		}
	} else {
		if !reflect.DeepEqual(got.Doc, want.Doc) {
			t.Fatalf("Doc differs:\n got %#v\nwant %#v", got.Doc, want.Doc)
		}
		if !reflect.DeepEqual(got.Call, want.Call) {
			t.Fatalf("Call differs:\n got %+v\nwant %+v", got.Call, want.Call)
		}
		if &got.Raw[0] != &raw[0] || len(got.Raw) != len(raw) || &want.Raw[0] != &raw[0] {
			t.Fatal("Raw is not the input")
		}
		sameSpan(t, "request", raw, got.request, want.request)
		sameSpan(t, "request.arguments", raw, got.Call.Request.Arguments, want.Call.Request.Arguments)
		sameSpan(t, "request._meta", raw, got.Call.Request.Meta, want.Call.Request.Meta)
		sameSpan(t, "capability", raw, got.Call.Capability, want.Call.Capability)
		sameSpan(t, "sender_signature", raw, got.Call.SenderSignature, want.Call.SenderSignature)
		sameSpan(t, "result", raw, got.Call.Result, want.Call.Result)
	}
	checkTreeDecoder(t, raw, lim.withDefaults().MaxDepth)
	return gotErr == nil
}

// checkTreeDecoder holds decodeObjectTree to its contract against
// encoding/json (UseNumber) and scanStructure: it accepts exactly the
// documents that are one JSON object passing the structural checks, and
// then yields the same tree and member spans; and the quick schema check
// never contradicts the library on that tree.
func checkTreeDecoder(t testing.TB, raw []byte, maxDepth int) {
	t.Helper()
	doc, spans, ok := decodeObjectTree(raw, maxDepth)
	var info scanInfo
	ref, refErr := decodeTree(raw)
	refOK := refErr == nil && utf8.Valid(raw)
	if refOK {
		refOK = scanStructure(raw, maxDepth, &info) == nil
	}
	_, isObject := ref.(map[string]any)
	if ok != (refOK && isObject) {
		t.Fatalf("tree decoder ok=%v; encoding/json and scanStructure accept=%v, object=%v", ok, refOK, isObject)
	}
	if !ok {
		return
	}
	if !reflect.DeepEqual(any(doc), ref) {
		t.Fatalf("tree differs from encoding/json:\n got %#v\nwant %#v", doc, ref)
	}
	want := spansFromScan(raw, &info)
	sameSpan(t, "span request", raw, spans.request, want.request)
	sameSpan(t, "span capability", raw, spans.capability, want.capability)
	sameSpan(t, "span sender_signature", raw, spans.senderSignature, want.senderSignature)
	sameSpan(t, "span result", raw, spans.result, want.result)
	sameSpan(t, "span arguments", raw, spans.arguments, want.arguments)
	sameSpan(t, "span _meta", raw, spans.meta, want.meta)
	checkQuickSound(t, doc)
}

// checkQuickSound fails if the quick check of the tool call schema
// contradicts the jsonschema library on doc, and returns its answer.
func checkQuickSound(t testing.TB, doc any) quickResult {
	t.Helper()
	cs, err := compiled()
	if err != nil {
		t.Fatal(err)
	}
	if cs.toolCallQuick == nil {
		t.Fatalf("no quick check: %v", cs.toolCallQuickErr)
	}
	q := cs.toolCallQuick.check(doc)
	libErr := cs.toolCall.Validate(doc)
	switch {
	case q == quickValid && libErr != nil:
		t.Fatalf("quick check accepts what the library rejects (%v): %#v", libErr, doc)
	case q == quickInvalid && libErr == nil:
		t.Fatalf("quick check rejects what the library accepts: %#v", doc)
	}
	return q
}

// parseCases are envelopes and near-envelopes, valid and not, that both
// parsers must treat alike.
func parseCases(t testing.TB) map[string][]byte {
	t.Helper()
	cases := map[string][]byte{}
	file, err := os.ReadFile("testdata/envelope_pre.json")
	if err != nil {
		t.Fatal(err)
	}
	cases["testdata envelope"] = file
	cases["minimal"] = mustJSON(t, baseEnvelope())
	cases["full post struct"] = mustJSON(t, fullToolCall())
	for name, mutate := range map[string]func(m map[string]any){
		"all optional pre fields": func(m map[string]any) {
			m["tool_class"], m["idempotency_key"] = "write", "k1"
			m["registry_digest"] = "sha256:" + strings.Repeat("ab", 32)
			m["capability"] = map[string]any{"capability": map[string]any{"constraints": map[string]any{"read_only": true}}, "delegations": []any{}}
			m["request_hash"] = strings.Repeat("0f", 32)
			m["expected_document_hashes"] = []any{map[string]any{"pointer": "/content", "hash": strings.Repeat("a", 64)}}
			m["content_hash_alg"], m["sender_signature"], m["parent_span_id"] = "sha256", map[string]any{"sig": "x"}, "00f067aa0ba902b7"
			m["request"].(map[string]any)["_meta"] = map[string]any{"progressToken": 1.5e300}
			m["workspace_root"] = "/srv/ws"
			m["tool_definition_sha256"] = strings.Repeat("ab", 32)
			m["token_handling"] = map[string]any{"mode": "token_exchange", "audience": "files", "passthrough_detected": false}
			m["upstream_sandbox"] = map[string]any{"sandboxed": true, "network": "allowlist", "allowlist_sha256": "sha256:" + strings.Repeat("ab", 32)}
		},
		"upstream_sandbox unconfined": func(m map[string]any) {
			m["upstream_sandbox"] = map[string]any{"sandboxed": false, "network": "unconfined"}
		},
		"upstream_sandbox unknown network": func(m map[string]any) {
			m["upstream_sandbox"] = map[string]any{"sandboxed": true, "network": "host"}
		},
		"upstream_sandbox bad digest": func(m map[string]any) {
			m["upstream_sandbox"] = map[string]any{"sandboxed": true, "network": "allowlist", "allowlist_sha256": strings.Repeat("ab", 32)}
		},
		"upstream_sandbox without network": func(m map[string]any) {
			m["upstream_sandbox"] = map[string]any{"sandboxed": true}
		},
		"token_handling unknown mode": func(m map[string]any) {
			m["token_handling"] = map[string]any{"mode": "passthrough", "audience": "", "passthrough_detected": true}
		},
		"token_handling without passthrough_detected": func(m map[string]any) {
			m["token_handling"] = map[string]any{"mode": "none", "audience": ""}
		},
		"relative workspace_root": func(m map[string]any) { m["workspace_root"] = "srv/ws" },
		"prompts/get":             func(m map[string]any) { m["mcp_method"] = "prompts/get" },
		"mcp_method tools/call":   func(m map[string]any) { m["mcp_method"] = "tools/call" },
		"capability array":        func(m map[string]any) { m["capability"] = []any{"a", 1, nil, true} },
		"capability string":       func(m map[string]any) { m["capability"] = "opaque" },
		"capability number":       func(m map[string]any) { m["capability"] = 7 },
		"sender_signature array":  func(m map[string]any) { m["sender_signature"] = []any{} },
		"pre with result":         func(m map[string]any) { m["result"] = map[string]any{} },
		"post without result":     func(m map[string]any) { m["phase"] = "post"; m["ok"] = false },
		"missing request":         func(m map[string]any) { delete(m, "request") },
		"request not object":      func(m map[string]any) { m["request"] = []any{map[string]any{"arguments": 1}} },
		"arguments not object":    func(m map[string]any) { m["request"].(map[string]any)["arguments"] = "x" },
		"unknown member":          func(m map[string]any) { m["extra"] = 1 },
		"unknown actor member":    func(m map[string]any) { m["actor"].(map[string]any)["x"] = 1 },
		"bad uuid":                func(m map[string]any) { m["tool_call_id"] = "0190f5b2-7c1e-7a3b-8d4e-1f2a3b4c5d6" },
		"session_id empty":        func(m map[string]any) { m["session_id"] = "" },
		"session_id 256 runes":    func(m map[string]any) { m["session_id"] = strings.Repeat("é", 256) },
		"session_id 257 runes":    func(m map[string]any) { m["session_id"] = strings.Repeat("é", 257) },
		"leap second":             func(m map[string]any) { m["issued_at"] = "2016-12-31T23:59:60Z" },
		"leap second offset":      func(m map[string]any) { m["issued_at"] = "2017-01-01T00:59:60+01:00" },
		"bad leap second":         func(m map[string]any) { m["issued_at"] = "2016-12-31T22:59:60Z" },
		"lower t and z":           func(m map[string]any) { m["issued_at"] = "2025-01-15t10:20:30z" },
		"feb 29 non-leap":         func(m map[string]any) { m["issued_at"] = "2025-02-29T10:20:30Z" },
		"request name differs":    func(m map[string]any) { m["request"].(map[string]any)["name"] = "other" },
		"bad pointer": func(m map[string]any) {
			m["expected_document_hashes"] = []any{map[string]any{"pointer": "/a~2", "hash": strings.Repeat("a", 64)}}
		},
		"numbers": func(m map[string]any) {
			m["request"].(map[string]any)["arguments"] = map[string]any{"a": 0, "b": -1, "c": 1.25, "d": 1e-7, "e": json.Number("-0.0E+00"), "f": json.Number("123456789012345678901234567890")}
		},
		"unicode": func(m map[string]any) {
			m["request"].(map[string]any)["arguments"] = map[string]any{"é\u2028": "日本語 \U0001F600 \u007f", "": ""}
		},
	} {
		m := baseEnvelope()
		mutate(m)
		cases[name] = mustJSON(t, m)
	}
	min := string(mustJSON(t, baseEnvelope()))
	raw := map[string]string{
		"empty":                     "",
		"whitespace only":           " \n\t\r",
		"not json":                  `{"x":`,
		"top-level array":           `[{}]`,
		"top-level string":          `"x"`,
		"top-level null":            `null`,
		"empty object":              `{}`,
		"empty object spaced":       " \r\n\t{ \n } \n",
		"trailing data":             min + ` {}`,
		"trailing comma":            `{"a":1,}`,
		"trailing comma array":      `{"a":[1,]}`,
		"leading zero":              `{"a":01}`,
		"bare minus":                `{"a":-}`,
		"dot without digits":        `{"a":1.}`,
		"exponent without digits":   `{"a":1e}`,
		"plus sign":                 `{"a":+1}`,
		"hex number":                `{"a":0x1}`,
		"nan":                       `{"a":NaN}`,
		"true prefix":               `{"a":tru}`,
		"true suffix":               `{"a":truex}`,
		"single quotes":             `{'a':1}`,
		"unquoted key":              `{a:1}`,
		"missing colon":             `{"a" 1}`,
		"missing comma":             `{"a":1 "b":2}`,
		"control char in string":    "{\"a\":\"x\ty\"}",
		"nul in string":             "{\"a\":\"x\x00y\"}",
		"bad escape":                `{"a":"\x"}`,
		"short unicode escape":      `{"a":"\u12"}`,
		"non-hex unicode escape":    `{"a":"\u12g4"}`,
		"escape at end":             `{"a":"\`,
		"unterminated string":       `{"a":"abc`,
		"invalid utf8":              "{\"a\":\"\xff\"}",
		"invalid utf8 key":          "{\"\xc3\":1}",
		"utf8 surrogate bytes":      "{\"a\":\"\xed\xa0\x80\"}",
		"overlong utf8":             "{\"a\":\"\xc0\xaf\"}",
		"bom":                       "\xef\xbb\xbf{}",
		"non-ascii outside strings": "{\"a\":1\u00a0}",
		"escapes":                   `{"a":"\"\\\/\b\f\n\r\t\u0000\u00e9\u2028\ud83d\ude00"}`,
		"escaped key":               `{"\u0061":1,"b\n":2}`,
		"dup key":                   `{"a":1,"b":2,"a":3}`,
		"dup key after unescape":    `{"a":1,"\u0061":2}`,
		"dup key nested":            `{"a":{"b":[{"c":1,"c":1}]}}`,
		"dup key wide":              `{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":0,"k11":1,"k12":2,"k13":3,"k14":4,"k15":5,"k16":6,"k17":7,"k18":8,"k19":9,"k20":0,"k21":1,"k22":2,"k23":3,"k24":4,"k25":5,"k26":6,"k3":1}`,
		"wide nested":               `{"request":{"name":"x","arguments":{"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":0,"k11":1,"k12":2,"k13":3,"k14":4,"k15":5,"k16":6,"k17":7,"k18":8,"k19":9,"k20":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,[],{}],"k21":1,"k22":2,"k23":3,"k24":4,"k25":5,"k26":6}}}`,
		"lone high surrogate":       `{"a":"\ud800"}`,
		"lone low surrogate":        `{"a":"x\udc00"}`,
		"high then non-low":         `{"a":"\ud800\u0041"}`,
		"high then high":            `{"a":"\ud800\ud800\udc00"}`,
		"high then text":            `{"a":"\ud800x"}`,
		"low then low":              `{"a":"\udc00\udc00"}`,
		"pair reversed":             `{"a":"\udc00\ud800"}`,
		"pair at string end":        `{"a":"\ud800"`,
		"upper-case pair":           `{"a":"\uD83D\uDE00"}`,
		"surrogate in key":          `{"\udc00":1}`,
		"dup and syntax error":      `{"a":1,"a":2,`,
		"surrogate and syntax":      `{"a":"\ud800",}`,
		"deep arrays":               `{"a":` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `}`,
		"deep then dup":             `{"a":` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `,"a":1}`,
		"dup then deep":             `{"a":1,"a":` + strings.Repeat(`[`, 70) + strings.Repeat(`]`, 70) + `}`,
		"request keys escaped":      strings.Replace(strings.Replace(min, `"request"`, `"\u0072equest"`, 1), `"arguments"`, `"argument\u0073"`, 1),
		"request spaced":            strings.Replace(min, `"request":{`, "\"request\" :\n {  ", 1),
		"pretty printed":            prettyJSON(t, []byte(min)),
	}
	for name, s := range raw {
		cases[name] = []byte(s)
	}
	return cases
}

func prettyJSON(t testing.TB, b []byte) string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	out, err := json.MarshalIndent(v, "\t", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return " \r\n" + string(out) + "\n\n"
}

// TestParseMatchesReference: on every case, at several depth limits,
// ParseToolCall gives exactly the reference result.
func TestParseMatchesReference(t *testing.T) {
	accepted := 0
	for name, raw := range parseCases(t) {
		t.Run(name, func(t *testing.T) {
			for _, depth := range []int{0, 1, 2, 3, 4, 70, 71, 72} {
				if checkSameAsReference(t, raw, Limits{MaxDepth: depth}) && depth == 0 {
					accepted++
				}
			}
			if checkSameAsReference(t, raw, Limits{MaxBytes: len(raw) - 1}) && len(raw) > 0 {
				t.Fatal("oversize envelope accepted")
			}
		})
	}
	if accepted < 10 {
		t.Fatalf("only %d cases were valid envelopes; the table no longer exercises acceptance", accepted)
	}
}

// TestParseFastPathTaken: well-formed envelopes never need the reference
// checks or the library, which is what makes ParseToolCall fast.
func TestParseFastPathTaken(t *testing.T) {
	cs, err := compiled()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"testdata envelope", "minimal", "full post struct", "all optional pre fields", "unicode", "numbers"} {
		raw := parseCases(t)[name]
		doc, _, ok := decodeObjectTree(raw, DefaultMaxDepth)
		if !ok {
			t.Fatalf("%s: the one-pass decoder declined a well-formed envelope", name)
		}
		if q := cs.toolCallQuick.check(doc); q != quickValid {
			t.Fatalf("%s: quick check says %d, not valid", name, q)
		}
	}
}

// FuzzParseMatchesReference is the differential fuzz test of the fast
// path: for any input and depth limit, ParseToolCall's result is the
// reference's, the tree decoder agrees with encoding/json, and the quick
// schema check never contradicts the library. Its seeds (parseCases and
// testdata/fuzz/FuzzParseMatchesReference) run in every go test.
func FuzzParseMatchesReference(f *testing.F) {
	for _, raw := range parseCases(f) {
		f.Add(raw, uint8(0))
	}
	f.Fuzz(func(t *testing.T, raw []byte, depth uint8) {
		checkSameAsReference(t, raw, Limits{MaxDepth: int(depth % 80)})
	})
}
