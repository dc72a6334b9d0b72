package jsonkit

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/gowebpki/jcs"
)

// CanonicalTree returns the RFC 8785 form of a decoded JSON tree, as
// encoding/json produces it with UseNumber: map[string]any, []any, string,
// json.Number, bool and nil. It equals Canonicalize of the tree's source
// bytes without parsing them again, so a caller that has already parsed an
// envelope hashes its parts for a fraction of the cost. Numbers are read as
// IEEE doubles, as JCS requires.
func CanonicalTree(v any) ([]byte, error) {
	return appendTree(make([]byte, 0, 512), v, 0)
}

// AppendCanonicalTree appends CanonicalTree(v) to dst: a caller that only
// hashes the bytes can reuse one buffer. On error it returns nil.
func AppendCanonicalTree(dst []byte, v any) ([]byte, error) {
	return appendTree(dst, v, 0)
}

func appendTree(dst []byte, v any, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, fmt.Errorf("jsonkit: canonical: value nested too deeply")
	}
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		if x {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case string:
		return AppendString(dst, x), nil
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil {
			return nil, fmt.Errorf("jsonkit: canonical: number %w", err)
		}
		s, err := jcs.NumberToJSON(f)
		if err != nil {
			return nil, fmt.Errorf("jsonkit: canonical: %w", err)
		}
		return append(dst, s...), nil
	case float64:
		s, err := jcs.NumberToJSON(x)
		if err != nil {
			return nil, fmt.Errorf("jsonkit: canonical: %w", err)
		}
		return append(dst, s...), nil
	case []any:
		dst = append(dst, '[')
		for i, e := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendTree(dst, e, depth+1); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, compareUTF16)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, k)
			dst = append(dst, ':')
			var err error
			if dst, err = appendTree(dst, x[k], depth+1); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	}
	return nil, fmt.Errorf("jsonkit: canonical: unsupported tree value %T", v)
}
