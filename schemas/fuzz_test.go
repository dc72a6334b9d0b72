package schemas

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

func FuzzParseToolCall(f *testing.F) {
	if raw, err := os.ReadFile("testdata/envelope_pre.json"); err == nil {
		f.Add(raw)
	}
	b, _ := json.Marshal(baseEnvelope())
	f.Add(b)
	b, _ = json.Marshal(fullToolCall())
	f.Add(b)
	for _, s := range []string{`{}`, `[]`, `{"a":1,"a":2}`, `{"a":"\ud800"}`, `{"\u0061":1,"a":1}`, `[[[[[[[[[[[[`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		lim := Limits{MaxDepth: 16}
		pc, err := ParseToolCall(raw, lim)
		_, _, _ = BestEffortIDs(raw)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Code != CodeEnvelopeInvalid || len(ve.Details) == 0 {
				t.Fatalf("error is not a VAL-HTC-001 ValidationError: %v", err)
			}
		} else {
			// Anything accepted re-validates from its own struct.
			again, err := json.Marshal(pc.Call)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ParseToolCall(again, Limits{}); err != nil {
				t.Fatalf("accepted envelope does not re-validate: %v\n%s", err, again)
			}
			if _, err := pc.RequestJSON(); err != nil {
				t.Fatal(err)
			}
		}
		// The scanner agrees with the slow reference on valid JSON.
		if json.Valid(raw) {
			dup, deep := slowDupOrDeep(raw, 16)
			serr := scanStructure(raw, 16, nil)
			var se *scanError
			gotDup := errors.As(serr, &se) && se.what == "duplicate object key"
			gotDeep := errors.As(serr, &se) && strings.HasPrefix(se.what, "nesting")
			surrogate := errors.As(serr, &se) && se.what == "unpaired surrogate escape"
			if !surrogate && (gotDup != dup || gotDeep != deep) {
				t.Fatalf("scanner dup=%v deep=%v, reference dup=%v deep=%v", gotDup, gotDeep, dup, deep)
			}
		}
	})
}
