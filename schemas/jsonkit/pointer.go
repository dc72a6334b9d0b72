package jsonkit

// This file is RFC 6901 JSON pointers, the one implementation every package
// uses: syntax checks, parsing into reference tokens, escaping, joining,
// and resolving against a decoded JSON document.

import (
	"errors"
	"strconv"
	"strings"
)

// ErrPointerSyntax is returned for a string that is not a JSON pointer.
var ErrPointerSyntax = errors.New("jsonkit: invalid JSON pointer")

// ValidPointer reports whether p is a JSON pointer: "" (the whole document), or
// "/"-prefixed reference tokens in which "~" only appears as "~0" or "~1".
func ValidPointer(p string) bool {
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

// ParsePointer splits p into unescaped reference tokens. "" is the whole document
// (no tokens).
func ParsePointer(p string) ([]string, error) {
	if !ValidPointer(p) {
		return nil, ErrPointerSyntax
	}
	if p == "" {
		return nil, nil
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		if strings.Contains(t, "~") {
			toks[i] = unescapeToken(t)
		}
	}
	return toks, nil
}

// unescapeToken decodes a token ValidPointer accepted: "~1" is "/", then "~0" is "~".
func unescapeToken(t string) string {
	return strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
}

// EscapeToken escapes one reference token ("~" → "~0", "/" → "~1").
func EscapeToken(t string) string {
	if !strings.ContainsAny(t, "~/") {
		return t
	}
	return strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
}

// JoinPointer builds a pointer from unescaped tokens.
func JoinPointer(toks []string) string {
	var sb strings.Builder
	for _, t := range toks {
		sb.WriteByte('/')
		sb.WriteString(EscapeToken(t))
	}
	return sb.String()
}

// ResolvePointer evaluates p against a decoded JSON document (objects
// map[string]any, arrays []any, as encoding/json decodes into any). Array
// tokens must be canonical indexes (ArrayIndex) within bounds; "-" never
// resolves. found is false for a malformed pointer or a missing member.
func ResolvePointer(doc any, p string) (v any, found bool) {
	toks, err := ParsePointer(p)
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
			i, ok := ArrayIndex(t)
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

// ArrayIndex reads an array index token: "0", or digits without a leading zero
// (at most 9 of them).
func ArrayIndex(t string) (int, bool) {
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
