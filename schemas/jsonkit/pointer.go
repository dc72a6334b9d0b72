// Package jsonpointer is RFC 6901 JSON pointers, the one implementation
// every package uses: syntax checks, parsing into reference tokens,
// escaping, joining, and resolving against a decoded JSON document.
package jsonpointer

import (
	"errors"
	"strconv"
	"strings"
)

// ErrSyntax is returned for a string that is not a JSON pointer.
var ErrSyntax = errors.New("jsonpointer: invalid JSON pointer")

// Valid reports whether p is a JSON pointer: "" (the whole document), or
// "/"-prefixed reference tokens in which "~" only appears as "~0" or "~1".
func Valid(p string) bool {
	if p == "" {
		return true
	}
	if p[0] != '/' {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '~' && (i+1 == len(p) || (p[i+1] != '0' && p[i+1] != '1')) {
			return false
		}
	}
	return true
}

// Parse splits p into unescaped reference tokens. "" is the whole document
// (no tokens).
func Parse(p string) ([]string, error) {
	if !Valid(p) {
		return nil, ErrSyntax
	}
	if p == "" {
		return nil, nil
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		if strings.Contains(t, "~") {
			toks[i] = unescape(t)
		}
	}
	return toks, nil
}

// unescape decodes a token Valid accepted: "~1" is "/", then "~0" is "~".
func unescape(t string) string {
	return strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
}

// Escape escapes one reference token ("~" → "~0", "/" → "~1").
func Escape(t string) string {
	if !strings.ContainsAny(t, "~/") {
		return t
	}
	return strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
}

// Join builds a pointer from unescaped tokens.
func Join(toks []string) string {
	var sb strings.Builder
	for _, t := range toks {
		sb.WriteByte('/')
		sb.WriteString(Escape(t))
	}
	return sb.String()
}

// Resolve evaluates p against a decoded JSON document (objects
// map[string]any, arrays []any, as encoding/json decodes into any). Array
// tokens must be canonical indexes (Index) within bounds; "-" never
// resolves. found is false for a malformed pointer or a missing member.
func Resolve(doc any, p string) (v any, found bool) {
	toks, err := Parse(p)
	if err != nil {
		return nil, false
	}
	cur := doc
	for _, t := range toks {
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[t]
			if !ok {
				return nil, false
			}
			cur = next
		case []any:
			i, ok := Index(t)
			if !ok || i >= len(v) {
				return nil, false
			}
			cur = v[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// Index reads an array index token: "0", or digits without a leading zero
// (at most 9 of them).
func Index(t string) (int, bool) {
	if t == "" || len(t) > 9 || (len(t) > 1 && t[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(t); i++ {
		if t[i] < '0' || t[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(t)
	return n, err == nil
}
