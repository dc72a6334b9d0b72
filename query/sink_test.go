package query

import (
	"bytes"
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gowebpki/jcs"

	"github.com/talos-audit/talos/schemas"
)

// readerWalk reads doc as a whole with a jsonReader and reports whether it
// took it.
func readerWalk(doc string) bool {
	r := jsonReader{s: doc}
	r.skip()
	return r.done()
}

func TestJSONReaderAcceptsOnlyWhatItShould(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want bool
	}{
		{`{"a":1,"b":[true,false,null,"x",-0.5e+3,{}],"c":{"d":""}}`, true},
		{`"caf\u00e9 \"q\" \\ \/ \b\f\n\r\t"`, true},
		{`"ü€😀"`, true},
		{`[]`, true},
		{`0`, true},
		{``, false},
		{` {}`, false},            // whitespace: not published form
		{`{"a":1 }`, false},       // whitespace
		{`{"b":1,"a":2}`, false},  // keys out of order
		{`{"a":1,"a":2}`, false},  // repeated key
		{`{"\u0061":1}`, false},   // escaped key
		{`"\ud83d\ude00"`, false}, // escaped surrogates
		{`"\x"`, false},           // invalid escape
		{"\"a\x01\"", false},      // control character
		{"\"\xff\"", false},       // invalid UTF-8
		{`01`, false},             // leading zero
		{`1.`, false},             // no fraction digits
		{`-`, false},              // no digits
		{`tru`, false},            // truncated literal
		{`{"a":1,}`, false},       // trailing comma
		{`[1,]`, false},           // trailing comma
		{`[,1]`, false},           // leading comma
		{`{"a"1}`, false},         // no colon
		{`{}{}`, false},           // two values
		{`{"a":[1}`, false},       // mismatched
		{strings.Repeat("[", 65) + strings.Repeat("]", 65), false}, // too deep
		{strings.Repeat("[", 64) + strings.Repeat("]", 64), true},
	} {
		if got := readerWalk(tc.doc); got != tc.want {
			t.Errorf("%q: took %v, want %v", tc.doc, got, tc.want)
		}
		if readerWalk(tc.doc) && !json.Valid([]byte(tc.doc)) {
			t.Errorf("%q: taken but not valid JSON", tc.doc)
		}
	}
}

// A document the reader takes is valid JSON, and every string it decodes
// is what encoding/json decodes.
func FuzzJSONReader(f *testing.F) {
	for _, s := range []string{`{"a":"b\n","c":[1,2.5e-3,"\u00e9"]}`, `"x"`, `[null,true]`, `{"a":{"b":{}}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		if readerWalk(doc) && !json.Valid([]byte(doc)) {
			t.Fatalf("%q taken but not valid JSON", doc)
		}
		r := jsonReader{s: doc}
		got := r.str()
		if !r.done() {
			return
		}
		var want string
		if err := json.Unmarshal([]byte(doc), &want); err != nil || got != want {
			t.Fatalf("%q: str %q, encoding/json %q (%v)", doc, got, want, err)
		}
	})
}

func TestParseEventTime(t *testing.T) {
	for _, s := range []string{
		"2026-03-04T05:06:07.890Z", "2026-03-04T05:06:07Z", "2026-03-04T05:06:07.1Z", "2026-03-04T05:06:07.123456789Z",
		"1970-01-01T00:00:00.000Z", "2024-02-29T23:59:59.999Z", "9999-12-31T23:59:59.999Z",
	} {
		want, err := time.Parse(time.RFC3339Nano, s)
		got, ok := parseEventTime(s)
		if err != nil || !ok || !reflectEqualTime(got, want.UTC()) {
			t.Errorf("%s: got %v %v, want %v %v", s, got, ok, want, err)
		}
	}
	for _, s := range []string{
		"", "2026-03-04T05:06:07.890", "2026-03-04T05:06:07.890+00:00", "2026-03-04t05:06:07Z", "2026-03-04T05:06:07.Z",
		"2026-03-04T05:06:07.1234567890Z", "1969-12-31T23:59:59.999Z", "2025-02-29T00:00:00Z", "2026-13-01T00:00:00Z",
		"2026-00-01T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T00:60:00Z",
		"2026-01-01T00:00:60Z", "2026-01-01T00:00:0aZ", "+026-01-01T00:00:00Z", "2026-01-01T00:00:00.-1Z",
	} {
		if got, ok := parseEventTime(s); ok {
			t.Errorf("%q: took it as %v", s, got)
		}
	}
}

// reflectEqualTime compares times the way reflect.DeepEqual compares rows.
func reflectEqualTime(a, b time.Time) bool { return a == b }

func FuzzParseEventTime(f *testing.F) {
	f.Add("2026-03-04T05:06:07.890Z")
	f.Add("2024-02-29T23:59:59Z")
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseEventTime(s)
		if !ok {
			return
		}
		want, err := time.Parse(time.RFC3339Nano, s)
		if err != nil || got != want.UTC() || want.Before(time.Unix(0, 0)) {
			t.Fatalf("%q: %v, time.Parse %v %v", s, got, want, err)
		}
	})
}

// mutations returns variants of the JSON document doc, each in RFC 8785
// form: for every object member at every depth, the member removed, its
// value replaced by values of every type and by near misses of the value
// it had, its key changed in case or spelling, and a sibling added.
func mutations(t testing.TB, doc []byte) [][]byte {
	t.Helper()
	decode := func() any {
		d := json.NewDecoder(bytes.NewReader(doc))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	encode := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		c, err := jcs.Transform(b)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// paths lists the members as key paths into the tree.
	var paths [][]string
	var walk func(v any, at []string)
	walk = func(v any, at []string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				p := append(slices.Clone(at), k)
				paths = append(paths, p)
				walk(x, p)
			}
		case []any:
			if len(v) > 0 {
				walk(v[0], append(slices.Clone(at), "0"))
			}
		}
	}
	walk(decode(), nil)
	// parentOf returns the object holding the member at p in tree v.
	parentOf := func(v any, p []string) map[string]any {
		for _, k := range p[:len(p)-1] {
			switch x := v.(type) {
			case map[string]any:
				v = x[k]
			case []any:
				v = x[0]
			}
		}
		m, _ := v.(map[string]any)
		return m
	}
	others := []any{nil, true, false, json.Number("0"), json.Number("-1"), json.Number("1.5"), json.Number("1e3"),
		json.Number("18446744073709551616"), "", "x", "é\n\"\\/", strings.Repeat("a", 600), []any{}, []any{"a"},
		[]any{nil}, []any{json.Number("1")}, []any{map[string]any{}}, map[string]any{}, map[string]any{"zz": "a"}}
	near := func(v any) []any {
		switch v := v.(type) {
		case string:
			out := []any{strings.ToUpper(v), v + "x", "x" + v, v + "\n", v + "/~2"}
			if v != "" {
				out = append(out, v[:len(v)-1])
			}
			return out
		case json.Number:
			n := strings.TrimPrefix(string(v), "-")
			bigger := json.Number("1" + n)
			if strings.ContainsAny(n, ".eE") {
				bigger = json.Number(n + "1")
			}
			return []any{bigger, json.Number("-" + n)}
		}
		return nil
	}
	var out [][]byte
	for _, p := range paths {
		key := p[len(p)-1]
		edit := func(fn func(m map[string]any)) {
			v := decode()
			if m := parentOf(v, p); m != nil {
				fn(m)
				out = append(out, encode(v))
			}
		}
		edit(func(m map[string]any) { delete(m, key) })
		edit(func(m map[string]any) { m["zz"+key] = m[key] })
		for _, k := range []string{strings.ToUpper(key), strings.ReplaceAll(key, "s", "ſ"), strings.ReplaceAll(key, "k", "\u212a"), key + "x"} {
			if k != key {
				edit(func(m map[string]any) { m[k] = m[key]; delete(m, key) })
			}
		}
		cur := parentOf(decode(), p)[key]
		for _, x := range append(slices.Clone(others), near(cur)...) {
			edit(func(m map[string]any) { m[key] = x })
		}
	}
	return out
}

// checkFastPathVariants runs check, which holds a fast path to its general
// path on one document and reports whether the fast path took it, on each
// published document and on every mutation of it. The fast path must take
// the published documents takes names, and the mutations must reach both
// paths.
func checkFastPathVariants(t *testing.T, published map[string][]byte, takes func(name string) bool, check func(*testing.T, []byte) bool) {
	t.Helper()
	taken, declined := 0, 0
	for name, raw := range published {
		if got, want := check(t, raw), takes(name); got != want {
			t.Errorf("%s: fast path took it: %v, want %v\n%s", name, got, want, raw)
		}
		for _, m := range mutations(t, raw) {
			if check(t, m) {
				taken++
			} else {
				declined++
			}
		}
	}
	t.Logf("fast path took %d variants and left %d to the general path", taken, declined)
	if taken == 0 || declined == 0 {
		t.Fatalf("variants taken %d, declined %d: the comparison covers one side only", taken, declined)
	}
}

// fuzzFastPath fuzzes check (as checkFastPathVariants) from the published
// documents and whatever f already holds.
func fuzzFastPath(f *testing.F, published map[string][]byte, check func(*testing.T, []byte) bool) {
	for _, raw := range published {
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) { check(t, raw) })
}

// The column tables name exactly the columns the DDL's column lists do, in
// their order (toolCallColumnsSQL is also what reads select).
func TestInsertColumnsMatchDDL(t *testing.T) {
	if want := strings.Split(strings.TrimSuffix(toolCallColumnsSQL, ", inserted_at"), ", "); !slices.Equal(toolCallInsertColumns, want) {
		t.Errorf("tool_calls columns %v, DDL list %v", toolCallInsertColumns, want)
	}
	for name, cols := range map[string][]string{"receipts": receiptInsertColumns, "tool_calls": toolCallInsertColumns,
		"artifacts": columnNames(artifactColumns)} {
		seen := map[string]bool{}
		for _, c := range cols {
			if seen[c] || !ValidName(c) {
				t.Errorf("%s: column %q repeated or invalid", name, c)
			}
			seen[c] = true
		}
	}
}

// Rows written through SinkWriter in several blocks per INSERT read back
// equal, column by column, to the rows derived from their events: a column
// appended out of place, or a block lost, shows.
func TestSinkWriteBlocksRoundTrip(t *testing.T) {
	ctx, conn, db := migrated(t)
	m := newSinkMaker(t)
	n := insertBlockRows + insertBlockRows/2 // two blocks of tool calls and artifacts, more of receipts
	var recs []schemas.AuditRecord
	for i := 0; i < n; i++ {
		fx := m.next(t, i)
		recs = append(recs, fx.decision, fx.effect, fx.toolCall)
	}
	w := NewSinkWriter(conn, db)
	if err := w.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	want := map[string]ReceiptRow{}
	wantCalls := map[string]ToolCallRow{}
	wantArts := map[string]string{}
	for _, rec := range recs {
		if strings.HasPrefix(rec.Subject, schemas.SubjectToolCall) {
			row, arts, err := ToolCallRowFromEvent(rec.Data)
			if err != nil {
				t.Fatal(err)
			}
			wantCalls[row.EventID] = row
			for _, a := range arts {
				wantArts[a.Ref] = string(a.Content)
			}
			continue
		}
		row, err := ReceiptRowFromEvent(rec.Data)
		if err != nil {
			t.Fatal(err)
		}
		want[row.ReceiptID] = row
	}
	got := 0
	if err := StreamReceipts(ctx, conn, db, func(r ReceiptRow) error {
		got++
		if d := differentFields(r, want[r.ReceiptID]); d != nil {
			t.Errorf("receipt %s: fields %v differ", r.ReceiptID, d)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got != len(want) {
		t.Fatalf("%d receipts stored, want %d", got, len(want))
	}
	got = 0
	if _, err := streamToolCalls(ctx, conn, db, func(r ToolCallRow) error {
		got++
		if d := differentFields(r, wantCalls[r.EventID]); d != nil {
			t.Errorf("tool call %s: fields %v differ", r.EventID, d)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got != len(wantCalls) {
		t.Fatalf("%d tool calls stored, want %d", got, len(wantCalls))
	}
	refs := make([]string, 0, len(wantArts))
	for ref := range wantArts {
		refs = append(refs, ref)
	}
	arts, err := Artifacts(ctx, conn, db, refs)
	if err != nil {
		t.Fatal(err)
	}
	if len(arts) != len(wantArts) {
		t.Fatalf("%d artifacts stored, want %d", len(arts), len(wantArts))
	}
	for _, a := range arts {
		if string(a.Content) != wantArts[a.Ref] || a.ContentType != ArtifactContentType {
			t.Errorf("artifact %s: %s %q", a.Ref, a.ContentType, a.Content)
		}
	}
}

// differentFields names the fields of two rows (structs of one type) that
// differ, read field by field rather than through the column tables under
// test: times by instant at the DateTime's second, arrays element by
// element (nil and empty equal); InsertedAt is not compared.
func differentFields(a, b any) []string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for i := 0; i < va.NumField(); i++ {
		name := va.Type().Field(i).Name
		x, y := va.Field(i).Interface(), vb.Field(i).Interface()
		var equal bool
		switch x := x.(type) {
		case time.Time:
			equal = name == "InsertedAt" || x.Unix() == y.(time.Time).Unix()
		case []string:
			equal = slices.Equal(x, y.([]string))
		default:
			equal = x == y
		}
		if !equal {
			out = append(out, name)
		}
	}
	return out
}

// SessionCounter counts one session's receipts and, when asked, its
// ToolCallEvents.
func TestSessionCounter(t *testing.T) {
	ctx, conn, db := migrated(t)
	m := newSinkMaker(t)
	var recs []schemas.AuditRecord
	for i := range 3 {
		fx := m.next(t, i)
		recs = append(recs, fx.decision, fx.effect, fx.toolCall)
	}
	if err := NewSinkWriter(conn, db).Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	receiptsOf, callsOf := map[string]uint64{}, map[string]uint64{}
	for _, rec := range recs {
		if strings.HasPrefix(rec.Subject, schemas.SubjectToolCall) {
			c, _, err := ToolCallRowFromEvent(rec.Data)
			if err != nil {
				t.Fatal(err)
			}
			callsOf[c.SessionID]++
		} else if r, err := ReceiptRowFromEvent(rec.Data); err != nil {
			t.Fatal(err)
		} else {
			receiptsOf[r.SessionID]++
		}
	}
	for _, session := range slices.Concat(slices.Collect(maps.Keys(receiptsOf)), slices.Collect(maps.Keys(callsOf))) {
		n, c, err := SessionCounter(conn, db, session, true)(ctx)
		if err != nil || n != receiptsOf[session] || c != callsOf[session] {
			t.Fatalf("session %s: %d receipts, %d tool calls (%v); want %d, %d", session, n, c, err, receiptsOf[session], callsOf[session])
		}
	}
	row, err := ReceiptRowFromEvent(recs[0].Data)
	if err != nil || receiptsOf[row.SessionID] == 0 {
		t.Fatal(err)
	}
	if n, c, err := SessionCounter(conn, db, row.SessionID, false)(ctx); err != nil || n != receiptsOf[row.SessionID] || c != 0 {
		t.Fatalf("without events: %d receipts, %d tool calls (%v)", n, c, err)
	}
	if n, _, err := SessionCounter(conn, db, "no-such-session", true)(ctx); err != nil || n != 0 {
		t.Fatalf("another session: %d receipts (%v)", n, err)
	}
}
