package testenv

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
)

// Span is one span as the collector's file exporter wrote it (OTLP JSON).
type Span struct {
	// TraceID, SpanID and ParentSpanID are lowercase hex, as in the file
	// (and as trace.TraceID.String writes them); ParentSpanID is "" for a
	// root span.
	TraceID, SpanID, ParentSpanID string
	Name                          string
	// Kind is OTLP's SpanKind: 0 unspecified, 1 internal, 2 server,
	// 3 client, 4 producer, 5 consumer (the values of trace.SpanKind).
	Kind int
	// Service is the resource's service.name; Resource holds all the
	// resource's attributes.
	Service  string
	Resource map[string]any
	// Scope is the instrumentation scope's name (the tracer's name).
	Scope string
	// Attrs are the span's attributes, their OTLP values flattened:
	// string, int64, bool, float64, []byte, []any for an array and
	// map[string]any for a key-value list.
	Attrs map[string]any
	// StartNanos and EndNanos are Unix times in nanoseconds.
	StartNanos, EndNanos int64
	// Status is OTLP's status code (0 unset, 1 ok, 2 error) and
	// StatusMessage its description.
	Status        int
	StatusMessage string
}

// String is the span on one line, for failure messages.
func (s Span) String() string {
	return fmt.Sprintf("%s %q kind=%d trace=%s span=%s parent=%s status=%d attrs=%v",
		s.Service, s.Name, s.Kind, s.TraceID, s.SpanID, s.ParentSpanID, s.Status, s.Attrs)
}

// otlpTraces is the part of an OTLP JSON ExportTraceServiceRequest that
// Span holds.
type otlpTraces struct {
	ResourceSpans []struct {
		Resource struct {
			Attributes []otlpKeyValue `json:"attributes"`
		} `json:"resource"`
		ScopeSpans []struct {
			Scope struct {
				Name string `json:"name"`
			} `json:"scope"`
			Spans []otlpSpan `json:"spans"`
		} `json:"scopeSpans"`
	} `json:"resourceSpans"`
}

type otlpSpan struct {
	TraceID      string         `json:"traceId"`
	SpanID       string         `json:"spanId"`
	ParentSpanID string         `json:"parentSpanId"`
	Name         string         `json:"name"`
	Kind         int            `json:"kind"`
	Start        json.Number    `json:"startTimeUnixNano"`
	End          json.Number    `json:"endTimeUnixNano"`
	Attributes   []otlpKeyValue `json:"attributes"`
	Status       struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"status"`
}

type otlpKeyValue struct {
	Key   string       `json:"key"`
	Value otlpAnyValue `json:"value"`
}

// otlpAnyValue is OTLP's AnyValue in JSON: one member set. intValue is a
// string (a JSON number is accepted too), doubleValue a number or "NaN",
// "Infinity", "-Infinity", bytesValue base64.
type otlpAnyValue struct {
	StringValue *string         `json:"stringValue"`
	BoolValue   *bool           `json:"boolValue"`
	IntValue    json.RawMessage `json:"intValue"`
	DoubleValue json.RawMessage `json:"doubleValue"`
	BytesValue  *string         `json:"bytesValue"`
	ArrayValue  *struct {
		Values []otlpAnyValue `json:"values"`
	} `json:"arrayValue"`
	KvlistValue *struct {
		Values []otlpKeyValue `json:"values"`
	} `json:"kvlistValue"`
}

// parseOTLPLines reads the file exporter's output: one OTLP JSON document
// a line.
func parseOTLPLines(b []byte) ([]Span, error) {
	var spans []Span
	for n, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var doc otlpTraces
		if err := json.Unmarshal(line, &doc); err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		for _, rs := range doc.ResourceSpans {
			res, err := flattenAttrs(rs.Resource.Attributes)
			if err != nil {
				return nil, fmt.Errorf("line %d: resource: %w", n+1, err)
			}
			service, _ := res["service.name"].(string)
			for _, ss := range rs.ScopeSpans {
				for _, o := range ss.Spans {
					s, err := o.span()
					if err != nil {
						return nil, fmt.Errorf("line %d: span %q: %w", n+1, o.Name, err)
					}
					s.Service, s.Resource, s.Scope = service, res, ss.Scope.Name
					spans = append(spans, s)
				}
			}
		}
	}
	return spans, nil
}

func (o otlpSpan) span() (Span, error) {
	attrs, err := flattenAttrs(o.Attributes)
	if err != nil {
		return Span{}, err
	}
	s := Span{TraceID: o.TraceID, SpanID: o.SpanID, ParentSpanID: o.ParentSpanID, Name: o.Name, Kind: o.Kind,
		Attrs: attrs, Status: o.Status.Code, StatusMessage: o.Status.Message}
	if o.Start != "" {
		if s.StartNanos, err = o.Start.Int64(); err != nil {
			return Span{}, fmt.Errorf("startTimeUnixNano: %w", err)
		}
	}
	if o.End != "" {
		if s.EndNanos, err = o.End.Int64(); err != nil {
			return Span{}, fmt.Errorf("endTimeUnixNano: %w", err)
		}
	}
	return s, nil
}

func flattenAttrs(kvs []otlpKeyValue) (map[string]any, error) {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		v, err := kv.Value.flatten()
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", kv.Key, err)
		}
		m[kv.Key] = v
	}
	return m, nil
}

// flatten is the Go value of v (nil when no member is set).
func (v otlpAnyValue) flatten() (any, error) {
	switch {
	case v.StringValue != nil:
		return *v.StringValue, nil
	case v.BoolValue != nil:
		return *v.BoolValue, nil
	case v.IntValue != nil:
		return strconv.ParseInt(unquote(v.IntValue), 10, 64)
	case v.DoubleValue != nil:
		return strconv.ParseFloat(unquote(v.DoubleValue), 64)
	case v.BytesValue != nil:
		return base64.StdEncoding.DecodeString(*v.BytesValue)
	case v.ArrayValue != nil:
		out := make([]any, 0, len(v.ArrayValue.Values))
		for _, e := range v.ArrayValue.Values {
			x, err := e.flatten()
			if err != nil {
				return nil, err
			}
			out = append(out, x)
		}
		return out, nil
	case v.KvlistValue != nil:
		return flattenAttrs(v.KvlistValue.Values)
	}
	return nil, nil
}

// unquote is a JSON number or string's text: 42 and "42" are both 42.
func unquote(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}
