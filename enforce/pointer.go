package enforce

import (
	"errors"
	"strconv"
	"strings"
)

var errPointerSyntax = errors.New("enforce: invalid JSON pointer")

// parsePointer splits an RFC 6901 JSON pointer into unescaped reference
// tokens. "" is the whole document (no tokens).
func parsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, errPointerSyntax
	}
	toks := strings.Split(p[1:], "/")
	for i, t := range toks {
		if !strings.Contains(t, "~") {
			continue
		}
		var sb strings.Builder
		for j := 0; j < len(t); j++ {
			if t[j] != '~' {
				sb.WriteByte(t[j])
				continue
			}
			if j+1 >= len(t) || (t[j+1] != '0' && t[j+1] != '1') {
				return nil, errPointerSyntax
			}
			if t[j+1] == '0' {
				sb.WriteByte('~')
			} else {
				sb.WriteByte('/')
			}
			j++
		}
		toks[i] = sb.String()
	}
	return toks, nil
}

// escapeToken escapes one reference token ("~" → "~0", "/" → "~1").
func escapeToken(t string) string {
	if !strings.ContainsAny(t, "~/") {
		return t
	}
	return strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
}

// joinPointer builds a pointer from unescaped tokens.
func joinPointer(toks []string) string {
	var sb strings.Builder
	for _, t := range toks {
		sb.WriteByte('/')
		sb.WriteString(escapeToken(t))
	}
	return sb.String()
}

// resolvePointer evaluates pointer p against a generic JSON tree (objects
// map[string]any, arrays []any). Array tokens must be canonical indexes
// ("0" or no leading zero) within bounds; "-" never resolves.
func resolvePointer(doc any, p string) (any, bool) {
	toks, err := parsePointer(p)
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
			i, ok := arrayIndex(t)
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

func arrayIndex(t string) (int, bool) {
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

// ResolvePointer resolves an RFC 6901 pointer in a decoded JSON document
// (what encoding/json yields into any). found is false for a malformed
// pointer or a missing member.
func ResolvePointer(doc any, pointer string) (v any, found bool) { return resolvePointer(doc, pointer) }
