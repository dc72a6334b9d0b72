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

// TestFindPath: the member at the end of a path, found in one walk, as
// FindMember finds it level by level; a missing key or a value on the way
// that is not an object is not found, and a duplicate key on the way, even
// after the match, is an error.
func TestFindPath(t *testing.T) {
	for _, c := range []struct {
		doc   string
		path  []string
		want  string // the value found; "" when not found
		isErr bool
	}{
		{doc: `{"data":{"a":1,"request_hash":"ab","z":[{"request_hash":"no"}]},"id":"x"}`, path: []string{"data", "request_hash"}, want: `"ab"`},
		{doc: `{"a":{"request_hash":"no"},"data":{"b":{"c":[1]}},"e":2}`, path: []string{"data", "b", "c"}, want: `[1]`},
		{doc: `{"data":{"b":2}}`, path: []string{"data"}, want: `{"b":2}`},
		{doc: `{"data":{"a":1},"id":"x"}`, path: []string{"data", "request_hash"}},
		{doc: `{"id":"x","request_hash":"ab"}`, path: []string{"data", "request_hash"}},
		{doc: `{"data":"request_hash","x":{"request_hash":"ab"}}`, path: []string{"data", "request_hash"}},
		{doc: `{"data":{"request_hash":"ab","request_hash":"cd"}}`, path: []string{"data", "request_hash"}, isErr: true},
		{doc: `{"data":{"request_hash":"ab"},"data":{}}`, path: []string{"data", "request_hash"}, isErr: true},
		{doc: `{"data":1,"data":{"request_hash":"ab"}}`, path: []string{"data", "request_hash"}, isErr: true},
		{doc: `{"data":{"request_hash":"ab"}`, path: []string{"data", "request_hash"}, isErr: true},
		{doc: `["data"]`, path: []string{"data"}, isErr: true},
	} {
		m, found, err := FindPath([]byte(c.doc), 0, c.path...)
		switch {
		case c.isErr:
			if err == nil {
				t.Errorf("%s %v: no error (found %v)", c.doc, c.path, found)
			}
		case err != nil:
			t.Errorf("%s %v: %v", c.doc, c.path, err)
		case c.want == "" && found:
			t.Errorf("%s %v: found %s", c.doc, c.path, c.doc[m.ValStart:m.End])
		case c.want != "" && (!found || c.doc[m.ValStart:m.End] != c.want):
			t.Errorf("%s %v: found %v %q, want %s", c.doc, c.path, found, c.doc[m.ValStart:m.End], c.want)
		}
		if !c.isErr && c.want != "" {
			// The same range FindMember finds level by level.
			b, at := []byte(c.doc), 0
			var lm Member
			for _, k := range c.path {
				var ok bool
				if lm, ok, _, err = FindMember(b, at, k); err != nil || !ok {
					t.Fatalf("%s: FindMember %q: %v %v", c.doc, k, ok, err)
				}
				at = lm.ValStart
			}
			if lm != m {
				t.Errorf("%s %v: FindPath %+v, FindMember %+v", c.doc, c.path, m, lm)
			}
		}
	}
	if _, _, err := FindPath([]byte(`{}`), 0); err == nil {
		t.Error("FindPath without a key: no error")
	}
}
