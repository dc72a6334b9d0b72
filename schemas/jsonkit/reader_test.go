package jsonkit_test

import (
	"testing"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// TestReaderObject: members in any order, each once; white space only
// when allowed; an unknown name, a repeated one, a bad value or bad syntax
// is false.
func TestReaderObject(t *testing.T) {
	for _, tc := range []struct {
		in        string
		space, ok bool
		seen      uint
	}{
		{`{"a":1,"b":2}`, false, true, 3},
		{`{"b":2,"a":1}`, false, true, 3},
		{`{}`, false, true, 0},
		{` { "a" : 1 ,` + "\n" + `"b":2 } `, true, true, 3},
		{`{"a": 1}`, false, false, 0},
		{`{"a":1,"a":1}`, true, false, 0},
		{`{"c":1}`, true, false, 0},
		{`{"a":x}`, true, false, 0},
		{`{"a":1,}`, true, false, 0},
		{`{"a":1`, true, false, 0},
		{`["a"]`, true, false, 0},
	} {
		r := jsonkit.Reader{B: []byte(tc.in)}
		seen, ok := r.Object(tc.space, func(name string) (uint, bool) {
			_, ok := r.Uint()
			switch name {
			case "a":
				return 1, ok
			case "b":
				return 2, ok
			}
			return 0, false
		})
		if ok != tc.ok || seen != tc.seen {
			t.Errorf("%q (space %v): seen %b, %v; want %b, %v", tc.in, tc.space, seen, ok, tc.seen, tc.ok)
		}
	}
}
