package testenv

import (
	"math"
	"reflect"
	"testing"
)

// TestOTelSpanAttrsFlatten reads each OTLP JSON AnyValue form the
// collector's file exporter writes (and the ones OTLP JSON allows besides,
// such as an intValue as a number) into the Go value Span.Attrs promises.
func TestOTelSpanAttrsFlatten(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        any
	}{
		{"string", `{"stringValue":"a"}`, "a"},
		{"empty string", `{"stringValue":""}`, ""},
		{"int as string", `{"intValue":"-42"}`, int64(-42)},
		{"int as number", `{"intValue":7}`, int64(7)},
		{"false", `{"boolValue":false}`, false},
		{"double", `{"doubleValue":1.5}`, 1.5},
		{"infinity", `{"doubleValue":"-Infinity"}`, math.Inf(-1)},
		{"bytes", `{"bytesValue":"aGk="}`, []byte("hi")},
		{"array", `{"arrayValue":{"values":[{"stringValue":"x"},{"intValue":"1"}]}}`, []any{"x", int64(1)}},
		{"empty array", `{"arrayValue":{}}`, []any{}},
		{"kvlist", `{"kvlistValue":{"values":[{"key":"k","value":{"boolValue":true}}]}}`, map[string]any{"k": true}},
		{"no value", `{}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line := `{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},` +
				`"scopeSpans":[{"scope":{"name":"sc"},"spans":[{"traceId":"0102","spanId":"03","name":"n","kind":2,` +
				`"startTimeUnixNano":"10","endTimeUnixNano":"20","status":{"code":2,"message":"m"},` +
				`"attributes":[{"key":"a","value":` + tc.value + `}]}]}]}]}`
			spans, err := parseOTLPLines([]byte(line + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			want := Span{TraceID: "0102", SpanID: "03", Name: "n", Kind: 2, Service: "svc",
				Resource: map[string]any{"service.name": "svc"}, Scope: "sc", Attrs: map[string]any{"a": tc.want},
				StartNanos: 10, EndNanos: 20, Status: 2, StatusMessage: "m"}
			if len(spans) != 1 || !reflect.DeepEqual(spans[0], want) {
				t.Errorf("got  %#v\nwant %#v", spans, want)
			}
		})
	}
}

// TestOTelSpanParseRejects: a value the file cannot hold fails the parse
// (and so the test reading it) rather than reading as zero.
func TestOTelSpanParseRejects(t *testing.T) {
	for _, line := range []string{
		`{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"a","value":{"intValue":"x"}}]}]}]}]}`,
		`{"resourceSpans":[{"scopeSpans":[{"spans":[{"startTimeUnixNano":"soon"}]}]}]}`,
		`{"resourceSpans":`,
	} {
		if spans, err := parseOTLPLines([]byte(line)); err == nil {
			t.Errorf("%s: no error, spans %v", line, spans)
		}
	}
}
