package jsonkit

import (
	"bytes"
	"testing"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// FuzzCanonicalCheck: IsCanonicalObject never accepts what Canonicalize
// would change, and accepts Canonicalize's output for objects with plain
// member names.
func FuzzCanonicalCheck(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":-0}`, `{"a":1e21,"b":1e-7,"c":0.1,"d":-5,"e":123456789012345678}`,
		`{"a":"\u001f\u007f\b","b":[[],{}],"c":true,"d":false,"e":null}`, `{"b":1,"a":2}`, `{"a":1,"a":1}`,
		`{"a":"\/"}`, `{"a":"\u00e9"}`, `{"a":1.0}`, `{"a":"` + "\xff" + `"}`, `{"é":1}`, `{"a":01}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		canon, err := jcs.Transform(b)
		if IsCanonicalObject(b) && (err != nil || !bytes.Equal(canon, b)) {
			t.Fatalf("accepted as canonical, but Canonicalize gives %q (%v) for %q", canon, err, b)
		}
		if err != nil || len(canon) == 0 || canon[0] != '{' || IsCanonicalObject(canon) {
			return
		}
		// Rejected canonical output: only for escaped or non-ASCII
		// member names, or deep nesting.
		if !bytes.ContainsFunc(canon, func(r rune) bool { return r == '\\' || r >= utf8.RuneSelf }) &&
			bytes.Count(canon, []byte("{"))+bytes.Count(canon, []byte("[")) < maxFastDepth {
			t.Fatalf("canonical output rejected: %q", canon)
		}
	})
}
