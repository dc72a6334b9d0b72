package jsonkit

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	var doc any
	_ = json.Unmarshal([]byte(`{"foo":["bar","baz"],"":0,"a/b":1,"c%d":2,"e^f":3,"g|h":4,"i\\j":5,"k\"l":6," ":7,"m~n":8,"10":{"01":"x"}}`), &doc)
	cases := []struct {
		ptr   string
		want  any
		found bool
	}{
		{"", doc, true}, {"/foo/0", "bar", true}, {"/foo/1", "baz", true}, {"/", 0.0, true}, {"/a~1b", 1.0, true},
		{"/c%d", 2.0, true}, {"/e^f", 3.0, true}, {"/g|h", 4.0, true}, {"/i\\j", 5.0, true}, {`/k"l`, 6.0, true},
		{"/ ", 7.0, true}, {"/m~0n", 8.0, true}, {"/10/01", "x", true},
		{"/foo/2", nil, false}, {"/foo/-", nil, false}, {"/foo/01", nil, false}, {"/foo/-1", nil, false}, {"/foo/+1", nil, false},
		{"/foo/0/x", nil, false}, {"/missing", nil, false}, {"foo", nil, false}, {"/m~2n", nil, false}, {"/m~", nil, false},
		{"/a/b", nil, false}, {"/foo/99999999999999999999", nil, false},
	}
	for _, tc := range cases {
		got, found := ResolvePointer(doc, tc.ptr)
		if found != tc.found {
			t.Errorf("%q: found %v", tc.ptr, found)
			continue
		}
		if found && tc.ptr != "" {
			if gj, wj := mustMarshal(got), mustMarshal(tc.want); gj != wj {
				t.Errorf("%q: %s, want %s", tc.ptr, gj, wj)
			}
		}
	}
}

func mustMarshal(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func FuzzPointer(f *testing.F) {
	for _, s := range []string{"", "/", "/a~1b", "/m~0n", "/foo/0", "~", "/~2", "/a\x00b/c", "/0/00/-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// Arbitrary pointers never panic against a tree with objects and arrays.
		doc := map[string]any{"a": []any{map[string]any{"b": "x"}, "y"}, "": []any{}, "~/": map[string]any{}}
		ResolvePointer(doc, s)
		// A pointer that parses round-trips exactly through escaping.
		if toks, err := ParsePointer(s); err == nil {
			if got := JoinPointer(toks); got != s {
				t.Fatalf("round trip %q -> %q -> %q", s, toks, got)
			}
		}
		// Treat s as NUL-separated raw tokens: escape, parse back, resolve.
		toks := strings.Split(s, "\x00")
		p := JoinPointer(toks)
		back, err := ParsePointer(p)
		if err != nil || !slices.Equal(back, toks) {
			t.Fatalf("tokens %q -> %q -> %q (%v)", toks, p, back, err)
		}
		var tree any = "LEAF"
		for i := len(toks) - 1; i >= 0; i-- {
			tree = map[string]any{toks[i]: tree}
		}
		if v, ok := ResolvePointer(tree, p); !ok || v != "LEAF" {
			t.Fatalf("%q does not resolve its own tree", p)
		}
	})
}

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{"": true, "/": true, "/a~0b/~1c//d": true, "a": false, "/~": false, "/~2": false, "/a~": false} {
		if ValidPointer(s) != want {
			t.Errorf("ValidPointer(%q) = %v, want %v", s, !want, want)
		}
	}
	if toks, err := ParsePointer("/~01"); err != nil || len(toks) != 1 || toks[0] != "~1" {
		t.Errorf(`ParsePointer("/~01") = %q, %v; want ["~1"] (unescapeToken ~1 before ~0)`, toks, err)
	}
}
