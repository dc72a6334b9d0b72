package query

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/receipts/verify"
	"github.com/talos-audit/talos/schemas"
)

// fill sets every field reachable from v (a settable value) to a value
// distinct from its zero and from the other fields', so that a field a
// projection forgets shows up as a difference.
func fill(v reflect.Value, n *int, path string) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("%s-%d \"é\"\t\u2028", path, *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n, path)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), n, path+"."+v.Type().Field(i).Name)
			}
		}
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			v.SetBytes([]byte(fmt.Sprintf(`{"n":%d}`, *n)))
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), n, fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, n, path+".key")
		fill(e, n, path+".value")
		m.SetMapIndex(k, e)
		v.Set(m)
	}
}

// TestDerivedRowMatchesReceiptRowFromEvent: the verifier's row, built from
// the event its one parse yields, is the row ReceiptRowFromEvent derives
// from the same stored bytes, for receipts with every field set, with
// their optional fields empty, with odd times, and for events the verifier
// reads the general way.
func TestDerivedRowMatchesReceiptRowFromEvent(t *testing.T) {
	key := testKey(t)
	keys := verify.KeySet{key.KID: key.Public()}
	full := func(i int) *schemas.Receipt {
		var r schemas.Receipt
		n := i * 1000
		fill(reflect.ValueOf(&r).Elem(), &n, "r")
		return &r
	}
	empty := func(int) *schemas.Receipt { return &schemas.Receipt{} }
	synthLike := func(i int) *schemas.Receipt {
		return &schemas.Receipt{EventType: schemas.KindDecision, Tool: "read_file", ToolCallID: fmt.Sprint("tc-", i),
			ReasonCodes: []string{}, DocumentHashes: []schemas.DocumentHash{}, ContentHashAlg: schemas.ContentHashAlg}
	}
	times := []time.Time{tcAt, time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC), time.Date(2026, 1, 2, 3, 4, 5, 999e6, time.FixedZone("x", 7200))}
	types := []string{schemas.TypeReceiptDecision, schemas.TypeReceiptEffect, schemas.TypeReceiptControl}
	var raws [][]byte
	ch := receipts.NewChain("derive", key)
	for i, make := range []func(int) *schemas.Receipt{full, empty, synthLike, full} {
		for j, at := range times {
			m := receipts.Meta{Type: types[(i+j)%len(types)], Source: "talos://enforce/w1", Subject: fmt.Sprint("tc-", i), Time: at}
			s, err := ch.Seal(m, make(i*10+j))
			if err != nil {
				t.Fatal(err)
			}
			raws = append(raws, s.JSON)
		}
	}
	// The same events in another JSON form, and variants the verifier
	// reads the general way or not at all.
	n := len(raws)
	for _, raw := range raws[:n] {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		indented, _ := json.MarshalIndent(v, "", " ")
		raws = append(raws, indented)
	}
	first := string(raws[0])
	for _, edit := range [][2]string{
		{`"type":"dev.talos.receipt.`, `"type":"dev.talos.receipt.other.`},
		{`"type":"dev.talos.receipt.`, `"type":"dev.talos.toolcall.v1","typf":"`},
		{`"time":"`, `"time":"x`},
		{`"time":"`, `"timf":"`},
		{`"id":"`, `"id":" `},
		{`"tool":"`, `"tool":"x`},
	} {
		if !strings.Contains(first, edit[0]) {
			t.Fatalf("no %q in %s", edit[0], first)
		}
		raws = append(raws, []byte(strings.Replace(first, edit[0], edit[1], 1)))
	}
	canonical := 0
	for i, raw := range raws {
		ev, _ := verify.VerifyEvent(raw, keys)
		if i < n && ev != nil && ev.Canonical {
			canonical++
		}
		got, gerr := derivedRow(string(raw), raw, ev)
		want, werr := ReceiptRowFromEvent(raw)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) {
			t.Errorf("event %d: error %v, ReceiptRowFromEvent %v", i, gerr, werr)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("event %d: row differs:\n got %+v\nwant %+v\n%s", i, got, want, raw)
		}
	}
	if canonical != n {
		t.Errorf("%d of %d events as published were read in one pass, want all", canonical, n)
	}
}

// TestVerifyDatabaseBatchSignatures: batch signature verification reports
// exactly what the default does, on a database with every kind of
// tampering at once (a bad signature makes its batch fall back to one
// signature at a time).
func TestVerifyDatabaseBatchSignatures(t *testing.T) {
	f := newAuditFixture(t)
	f.mutate(t, TableReceipts, "UPDATE decision = 'deny' WHERE receipt_id = '"+f.ids[6]+"'")
	f.mutate(t, TableReceipts, `UPDATE cloudevent = replaceOne(cloudevent, '"decision":"allow"', '"decision":"deny"') WHERE receipt_id = '`+f.ids[11]+"'")
	f.mutate(t, TableReceipts, "DELETE WHERE receipt_id = '"+f.ids[14]+"'")
	f.mutate(t, TableReceipts, fmt.Sprintf("UPDATE chain_seq = if(chain_seq = 20, 21, 20) WHERE receipt_id IN ('%s', '%s')", f.ids[19], f.ids[20]))
	want := f.verify(t)
	got, err := VerifyDatabaseWith(f.ctx, f.conn, f.db, f.keys, VerifyOptions{BatchSignatures: true})
	if err != nil {
		t.Fatal(err)
	}
	wantProblems(t, want, ProblemAlteredColumn+" "+f.ids[6], verify.ProblemBadSignature+" "+f.ids[11],
		verify.ProblemChainGap+" "+f.ids[15], ProblemMissingReceipt+" "+f.ids[14],
		ProblemReordered+" "+f.ids[19], ProblemReordered+" "+f.ids[20])
	if !reflect.DeepEqual(got, want) {
		t.Errorf("with batch signatures:\n%+v\nwithout:\n%+v", got, want)
	}
}

// TestSameColumnsCoversEveryColumn: sameColumns, the verifier's cheap
// check, sees a change in every field of ReceiptRow that CompareColumns
// compares (a field added to the row without a place in sameColumns fails
// here), and agrees with CompareColumns on what is equal.
func TestSameColumnsCoversEveryColumn(t *testing.T) {
	base := func() ReceiptRow {
		var r ReceiptRow
		n := 0
		fill(reflect.ValueOf(&r).Elem(), &n, "row")
		return r
	}
	a := base()
	if b := base(); !sameColumns(&a, &b) || len(CompareColumns(a, b)) != 0 {
		t.Fatal("equal rows differ")
	}
	rt := reflect.TypeFor[ReceiptRow]()
	for i := range rt.NumField() {
		f := rt.Field(i)
		b := base()
		v := reflect.ValueOf(&b).Elem().Field(i)
		switch x := v.Interface().(type) {
		case string:
			v.SetString(x + "x")
		case uint64:
			v.SetUint(x + 1)
		case time.Time:
			v.Set(reflect.ValueOf(x.Add(time.Second)))
		case []string:
			v.Set(reflect.ValueOf(append(slices.Clone(x), "x")))
		default:
			t.Fatalf("field %s has a type (%T) this test does not change: teach it and sameColumns", f.Name, x)
		}
		compared := len(CompareColumns(a, b)) > 0
		if same := sameColumns(&a, &b); same == compared {
			t.Errorf("field %s changed: sameColumns %v, CompareColumns reports it: %v", f.Name, same, compared)
		}
	}
	// What CompareColumns treats as equal, sameColumns does too.
	b := base()
	b.ReasonCodes, a.ReasonCodes = nil, []string{}
	b.Time = a.Time.Add(time.Millisecond)
	if !sameColumns(&a, &b) || len(CompareColumns(a, b)) != 0 {
		t.Error("nil and empty arrays, or times within one second, differ")
	}
}
