package receipts

import (
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// maxSafeInteger is 2^53: the largest integer an IEEE double (and so RFC
// 8785) carries exactly together with all smaller ones.
const maxSafeInteger = 1 << 53

// ErrUnsafeInteger is returned by MarshalCanonical for an integer beyond
// ±2^53. RFC 8785 numbers are IEEE doubles, so such a value would be
// silently rounded; producers MUST carry it as a JSON string instead.
var ErrUnsafeInteger = errors.New("receipts: integer beyond ±2^53 cannot be canonicalized; carry it as a string")

// Canonicalize returns the RFC 8785 (JCS) form of the JSON document b. It
// rejects documents that are not JSON, have duplicate object keys, invalid
// UTF-8 or numbers that are not IEEE doubles. Integers above 2^53 are
// rounded by RFC 8785 itself; producers MUST carry them as strings.
func Canonicalize(b []byte) ([]byte, error) {
	if b == nil {
		b = []byte{}
	}
	out, err := jcs.Transform(b)
	if err != nil {
		return nil, fmt.Errorf("receipts: canonicalize: %w", err)
	}
	return out, nil
}

// MarshalCanonical returns the RFC 8785 form of v, equal to
// Canonicalize(json.Marshal(v)) but written in one pass without a
// marshal → parse round trip. It follows encoding/json's rules for field
// names, omitempty, "-", nil (null), []byte (base64) and invalid UTF-8
// (replaced by U+FFFD). Values that implement json.Marshaler (json.RawMessage
// among them) are canonicalized with Canonicalize.
//
// To fail closed rather than differ from encoding/json, it returns an error
// for what it does not reproduce: embedded (anonymous) struct fields, the
// ",string" tag option, maps with non-string keys, channels, funcs and
// complex numbers. It also returns ErrUnsafeInteger for integers beyond
// ±2^53 and an error for NaN and ±Inf.
func MarshalCanonical(v any) ([]byte, error) {
	return appendCanonical(nil, v)
}

func appendCanonical(dst []byte, v any) ([]byte, error) {
	e := canonEncoder{buf: dst}
	if err := e.value(reflect.ValueOf(v), 0); err != nil {
		return nil, err
	}
	return e.buf, nil
}

// maxCanonDepth bounds recursion through pointers and containers, so a
// cyclic value fails instead of overflowing the stack.
const maxCanonDepth = 1000

type canonEncoder struct {
	buf []byte
}

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

func (e *canonEncoder) value(v reflect.Value, depth int) error {
	if depth > maxCanonDepth {
		return errors.New("receipts: canonical: value nested too deeply (cycle?)")
	}
	if !v.IsValid() {
		e.buf = append(e.buf, "null"...)
		return nil
	}
	t := v.Type()
	if t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface {
		if t.Implements(marshalerType) {
			return e.marshaler(v)
		}
		if v.CanAddr() && reflect.PointerTo(t).Implements(marshalerType) {
			return e.marshaler(v.Addr())
		}
		if t.Implements(textMarshalerType) {
			return e.textMarshaler(v)
		}
		if v.CanAddr() && reflect.PointerTo(t).Implements(textMarshalerType) {
			return e.textMarshaler(v.Addr())
		}
	}
	switch t.Kind() {
	case reflect.String:
		e.buf = appendJCSString(e.buf, v.String())
	case reflect.Bool:
		if v.Bool() {
			e.buf = append(e.buf, "true"...)
		} else {
			e.buf = append(e.buf, "false"...)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n := v.Int()
		if n > maxSafeInteger || n < -maxSafeInteger {
			return fmt.Errorf("%w: %d", ErrUnsafeInteger, n)
		}
		e.buf = strconv.AppendInt(e.buf, n, 10)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		n := v.Uint()
		if n > maxSafeInteger {
			return fmt.Errorf("%w: %d", ErrUnsafeInteger, n)
		}
		e.buf = strconv.AppendUint(e.buf, n, 10)
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if t.Kind() == reflect.Float32 {
			// encoding/json writes a float32 with 32-bit precision; read
			// that text back as a double, as a JCS parser would.
			f, _ = strconv.ParseFloat(strconv.FormatFloat(f, 'g', -1, 32), 64)
		}
		s, err := jcs.NumberToJSON(f)
		if err != nil {
			return fmt.Errorf("receipts: canonical: %w", err)
		}
		e.buf = append(e.buf, s...)
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			e.buf = append(e.buf, "null"...)
			return nil
		}
		return e.value(v.Elem(), depth+1)
	case reflect.Slice:
		if v.IsNil() {
			e.buf = append(e.buf, "null"...)
			return nil
		}
		if t.Elem().Kind() == reflect.Uint8 && !t.Elem().Implements(marshalerType) &&
			!reflect.PointerTo(t.Elem()).Implements(marshalerType) &&
			!t.Elem().Implements(textMarshalerType) && !reflect.PointerTo(t.Elem()).Implements(textMarshalerType) {
			e.buf = appendJCSString(e.buf, base64.StdEncoding.EncodeToString(v.Bytes()))
			return nil
		}
		return e.array(v, depth)
	case reflect.Array:
		return e.array(v, depth)
	case reflect.Map:
		return e.mapValue(v, depth)
	case reflect.Struct:
		return e.structValue(v, depth)
	default:
		return fmt.Errorf("receipts: canonical: unsupported type %s", t)
	}
	return nil
}

func (e *canonEncoder) marshaler(v reflect.Value) error {
	if v.Kind() == reflect.Pointer && v.IsNil() {
		e.buf = append(e.buf, "null"...)
		return nil
	}
	m := v.Interface().(json.Marshaler)
	raw, err := m.MarshalJSON()
	if err != nil {
		return fmt.Errorf("receipts: canonical: %s.MarshalJSON: %w", v.Type(), err)
	}
	c, err := Canonicalize(raw)
	if err != nil {
		return fmt.Errorf("receipts: canonical: %s: %w", v.Type(), err)
	}
	e.buf = append(e.buf, c...)
	return nil
}

func (e *canonEncoder) textMarshaler(v reflect.Value) error {
	if v.Kind() == reflect.Pointer && v.IsNil() {
		e.buf = append(e.buf, "null"...)
		return nil
	}
	text, err := v.Interface().(encoding.TextMarshaler).MarshalText()
	if err != nil {
		return fmt.Errorf("receipts: canonical: %s.MarshalText: %w", v.Type(), err)
	}
	e.buf = appendJCSString(e.buf, string(text))
	return nil
}

func (e *canonEncoder) array(v reflect.Value, depth int) error {
	e.buf = append(e.buf, '[')
	for i := range v.Len() {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		if err := e.value(v.Index(i), depth+1); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, ']')
	return nil
}

func (e *canonEncoder) mapValue(v reflect.Value, depth int) error {
	if v.IsNil() {
		e.buf = append(e.buf, "null"...)
		return nil
	}
	if v.Type().Key().Kind() != reflect.String {
		return fmt.Errorf("receipts: canonical: unsupported map key type %s", v.Type().Key())
	}
	keys := make([]string, 0, v.Len())
	vals := make(map[string]reflect.Value, v.Len())
	iter := v.MapRange()
	for iter.Next() {
		k := iter.Key().String()
		if !utf8.ValidString(k) {
			k = strings.ToValidUTF8(k, "\uFFFD")
		}
		if _, dup := vals[k]; dup {
			return fmt.Errorf("receipts: canonical: map keys collide after UTF-8 repair: %q", k)
		}
		keys = append(keys, k)
		vals[k] = iter.Value()
	}
	sort.Slice(keys, func(i, j int) bool { return lessUTF16(keys[i], keys[j]) })
	e.buf = append(e.buf, '{')
	for i, k := range keys {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		e.buf = appendJCSString(e.buf, k)
		e.buf = append(e.buf, ':')
		if err := e.value(vals[k], depth+1); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, '}')
	return nil
}

func (e *canonEncoder) structValue(v reflect.Value, depth int) error {
	info, err := structInfoOf(v.Type())
	if err != nil {
		return err
	}
	e.buf = append(e.buf, '{')
	first := true
	for i := range info.fields {
		f := &info.fields[i]
		fv := v.Field(f.index)
		if f.omitEmpty && isEmptyValue(fv) {
			continue
		}
		if !first {
			e.buf = append(e.buf, ',')
		}
		first = false
		e.buf = append(e.buf, f.quotedName...)
		e.buf = append(e.buf, ':')
		if err := e.value(fv, depth+1); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, '}')
	return nil
}

// isEmptyValue is encoding/json's definition of empty for omitempty.
func isEmptyValue(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool:
		return !v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() == 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint() == 0
	case reflect.Float32, reflect.Float64:
		return v.Float() == 0
	case reflect.Interface, reflect.Pointer:
		return v.IsNil()
	}
	return false
}

type fieldInfo struct {
	index      int
	quotedName []byte // canonical JSON string of the member name
	omitEmpty  bool
}

type structInfo struct {
	fields []fieldInfo // in RFC 8785 member order
}

// structCache memoizes per-type field layouts. It is a pure function cache
// (a type's layout never changes), like encoding/json's own.
var structCache sync.Map // reflect.Type → *structInfo or error

func structInfoOf(t reflect.Type) (*structInfo, error) {
	if c, ok := structCache.Load(t); ok {
		if err, isErr := c.(error); isErr {
			return nil, err
		}
		return c.(*structInfo), nil
	}
	info, err := buildStructInfo(t)
	if err != nil {
		structCache.Store(t, err)
		return nil, err
	}
	structCache.Store(t, info)
	return info, nil
}

func buildStructInfo(t reflect.Type) (*structInfo, error) {
	type named struct {
		fieldInfo
		name string
	}
	var fs []named
	seen := map[string]bool{}
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		if sf.Anonymous {
			return nil, fmt.Errorf("receipts: canonical: %s: embedded field %s is not supported", t, sf.Name)
		}
		if !sf.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = sf.Name
		}
		omit := false
		for o := range strings.SplitSeq(opts, ",") {
			switch o {
			case "omitempty":
				omit = true
			case "string", "omitzero":
				return nil, fmt.Errorf("receipts: canonical: %s.%s: tag option %q is not supported", t, sf.Name, o)
			}
		}
		if seen[name] {
			return nil, fmt.Errorf("receipts: canonical: %s: duplicate JSON name %q", t, name)
		}
		seen[name] = true
		fs = append(fs, named{fieldInfo{index: i, quotedName: appendJCSString(nil, name), omitEmpty: omit}, name})
	}
	sort.Slice(fs, func(i, j int) bool { return lessUTF16(fs[i].name, fs[j].name) })
	info := &structInfo{fields: make([]fieldInfo, len(fs))}
	for i := range fs {
		info.fields[i] = fs[i].fieldInfo
	}
	return info, nil
}

// lessUTF16 orders strings by their UTF-16 code units, as RFC 8785 sorts
// object members.
func lessUTF16(a, b string) bool {
	return compareUTF16(a, b) < 0
}

func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			ua, ub := utf16Units(ra), utf16Units(rb)
			if ua[0] != ub[0] {
				return int(ua[0]) - int(ub[0])
			}
			return int(ua[1]) - int(ub[1])
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

func utf16Units(r rune) [2]uint16 {
	if r >= 0x10000 {
		r1, r2 := utf16.EncodeRune(r)
		return [2]uint16{uint16(r1), uint16(r2)}
	}
	return [2]uint16{uint16(r), 0}
}

// appendJCSString appends s as an RFC 8785 string: the JSON escapes \" \\
// \b \f \n \r \t, \u00xx for other control characters, everything else
// literal. Invalid UTF-8 is replaced by U+FFFD, as encoding/json does.
func appendJCSString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\uFFFD"...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
