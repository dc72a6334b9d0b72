package jsonkit

import (
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
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
var ErrUnsafeInteger = errors.New("jsonkit: integer beyond ±2^53 cannot be canonicalized; carry it as a string")

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
		return nil, fmt.Errorf("jsonkit: canonicalize: %w", err)
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
	var e canonEncoder
	return e.encode(dst, v)
}

// maxCanonDepth bounds recursion through pointers and containers, so a
// cyclic value fails instead of overflowing the stack.
const maxCanonDepth = 1000

var errCanonDepth = errors.New("jsonkit: canonical: value nested too deeply (cycle?)")

// AppendCanonicalObject appends the RFC 8785 form of v, which MUST encode
// as a JSON object, to dst, as MarshalCanonical writes it, and finds in
// the same pass the place of the member named key: at is the offset in b
// of that member if the object has one (found), else of the first member
// whose name sorts after key, or of the closing brace — where the member
// goes to keep RFC 8785 order. The signer inserts data.signature there
// without encoding the object again. at is -1 if v is not an object.
func AppendCanonicalObject(dst []byte, v any, key string) (b []byte, at int, found bool, err error) {
	e := canonEncoder{track: true, key: key}
	start := len(dst)
	if b, err = e.encode(dst, v); err != nil {
		return nil, -1, false, err
	}
	if b[start] != '{' {
		return b, -1, false, nil
	}
	if e.at < 0 { // written by a json.Marshaler: look the place up
		m, f, _, err := FindMember(b, start, key)
		if err != nil {
			return nil, -1, false, err
		}
		return b, m.Start, f, nil
	}
	return b, e.at, e.found, nil
}

// canonEncoder is the state of one encoding; the bytes themselves travel
// through the encoders as an argument and a result.
//
// With track set, the first struct or map it writes (the top-level object,
// behind any pointers) records where the member named key goes: at is the
// offset of that member, of the first member whose name sorts after it,
// or of the closing brace, and found is set if the object has the member.
// at stays -1 if the top-level value was written another way (a
// json.Marshaler).
type canonEncoder struct {
	track bool
	key   string
	at    int
	found bool
}

// encode appends the canonical form of v to b.
func (e *canonEncoder) encode(b []byte, v any) ([]byte, error) {
	e.at = -1
	if v == nil {
		return append(b, "null"...), nil
	}
	rv := reflect.ValueOf(v)
	return typeEncoder(rv.Type())(e, b, rv, 0)
}

var (
	marshalerType     = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
	canonicalType     = reflect.TypeFor[Canonical]()
)

// Canonical is JSON text already in RFC 8785 form, as CanonicalTree and
// AppendCanonicalObject write it. The canonical encoder appends it as it
// is, where it parses and encodes a json.RawMessage again; encoding/json
// marshals and unmarshals it as a json.RawMessage. Only bytes this
// package wrote belong in one: other bytes would be signed as they are.
type Canonical []byte

// MarshalJSON returns c ("null" when nil), as json.RawMessage does.
func (c Canonical) MarshalJSON() ([]byte, error) {
	if c == nil {
		return []byte("null"), nil
	}
	return c, nil
}

// UnmarshalJSON keeps a copy of data, as json.RawMessage does.
func (c *Canonical) UnmarshalJSON(data []byte) error {
	if c == nil {
		return errors.New("jsonkit: Canonical: UnmarshalJSON on nil pointer")
	}
	*c = append((*c)[0:0], data...)
	return nil
}

// canonicalEncoder appends a Canonical as it is.
func canonicalEncoder(_ *canonEncoder, b []byte, v reflect.Value, _ int) ([]byte, error) {
	if v.IsNil() {
		return append(b, "null"...), nil
	}
	return append(b, v.Bytes()...), nil
}

// encoderFunc appends to b the canonical form of v, a value of the type it
// was built for, at nesting depth.
type encoderFunc func(e *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error)

// encoderCache memoizes one encoderFunc per type. It is a pure function
// cache (a type's encoding never changes), like encoding/json's own.
var encoderCache sync.Map // reflect.Type → encoderFunc

func typeEncoder(t reflect.Type) encoderFunc {
	if f, ok := encoderCache.Load(t); ok {
		return f.(encoderFunc)
	}
	// A recursive type reaches itself while its encoder is being built:
	// hand out an indirection that waits for the real one.
	var (
		wg sync.WaitGroup
		f  encoderFunc
	)
	wg.Add(1)
	fi, loaded := encoderCache.LoadOrStore(t, encoderFunc(func(e *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
		wg.Wait()
		return f(e, b, v, depth)
	}))
	if loaded {
		return fi.(encoderFunc)
	}
	f = newTypeEncoder(t)
	wg.Done()
	encoderCache.Store(t, f)
	return f
}

// newTypeEncoder follows encoding/json's precedence: a json.Marshaler
// (on the value, or on its address when addressable), then an
// encoding.TextMarshaler (likewise), then the kind.
func newTypeEncoder(t reflect.Type) encoderFunc {
	k := t.Kind()
	if k == reflect.Pointer || k == reflect.Interface {
		return kindEncoder(t)
	}
	if t == canonicalType {
		return canonicalEncoder
	}
	if t.Implements(marshalerType) {
		return marshalerEncoder
	}
	rest := kindEncoder(t)
	if t.Implements(textMarshalerType) {
		rest = textMarshalerEncoder
	} else if reflect.PointerTo(t).Implements(textMarshalerType) {
		rest = condAddrEncoder(addrTextMarshalerEncoder, rest)
	}
	if reflect.PointerTo(t).Implements(marshalerType) {
		return condAddrEncoder(addrMarshalerEncoder, rest)
	}
	return rest
}

// implementsAny reports whether t or *t implements one of the interfaces.
func implementsAny(t reflect.Type, ifaces ...reflect.Type) bool {
	for _, i := range ifaces {
		if t.Implements(i) || reflect.PointerTo(t).Implements(i) {
			return true
		}
	}
	return false
}

func condAddrEncoder(ifAddr, otherwise encoderFunc) encoderFunc {
	return func(e *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
		if v.CanAddr() {
			return ifAddr(e, b, v, depth)
		}
		return otherwise(e, b, v, depth)
	}
}

func kindEncoder(t reflect.Type) encoderFunc {
	switch t.Kind() {
	case reflect.String:
		return stringEncoder
	case reflect.Bool:
		return boolEncoder
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return intEncoder
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return uintEncoder
	case reflect.Float32:
		return float32Encoder
	case reflect.Float64:
		return float64Encoder
	case reflect.Pointer:
		return pointerEncoder(t)
	case reflect.Interface:
		return interfaceEncoder
	case reflect.Slice:
		el := t.Elem()
		if el.Kind() == reflect.Uint8 && !el.Implements(marshalerType) && !reflect.PointerTo(el).Implements(marshalerType) &&
			!el.Implements(textMarshalerType) && !reflect.PointerTo(el).Implements(textMarshalerType) {
			return bytesEncoder
		}
		return sliceEncoder(t)
	case reflect.Array:
		return arrayEncoder(t)
	case reflect.Map:
		return mapEncoder(t)
	case reflect.Struct:
		return structEncoder(t)
	}
	return func(*canonEncoder, []byte, reflect.Value, int) ([]byte, error) {
		return nil, fmt.Errorf("jsonkit: canonical: unsupported type %s", t)
	}
}

func stringEncoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	return AppendString(b, v.String()), nil
}

func boolEncoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	if v.Bool() {
		return append(b, "true"...), nil
	}
	return append(b, "false"...), nil
}

func intEncoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	n := v.Int()
	if n > maxSafeInteger || n < -maxSafeInteger {
		return nil, fmt.Errorf("%w: %d", ErrUnsafeInteger, n)
	}
	return strconv.AppendInt(b, n, 10), nil
}

func uintEncoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	n := v.Uint()
	if n > maxSafeInteger {
		return nil, fmt.Errorf("%w: %d", ErrUnsafeInteger, n)
	}
	return strconv.AppendUint(b, n, 10), nil
}

func float32Encoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	// encoding/json writes a float32 with 32-bit precision; read that text
	// back as a double, as a JCS parser would.
	f, _ := strconv.ParseFloat(strconv.FormatFloat(v.Float(), 'g', -1, 32), 64)
	return appendFloat(b, f, depth)
}

func float64Encoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	return appendFloat(b, v.Float(), depth)
}

func appendFloat(b []byte, f float64, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	s, err := jcs.NumberToJSON(f)
	if err != nil {
		return nil, fmt.Errorf("jsonkit: canonical: %w", err)
	}
	return append(b, s...), nil
}

func pointerEncoder(t reflect.Type) encoderFunc {
	elem := typeEncoder(t.Elem())
	return func(e *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
		if depth > maxCanonDepth {
			return nil, errCanonDepth
		}
		if v.IsNil() {
			return append(b, "null"...), nil
		}
		return elem(e, b, v.Elem(), depth+1)
	}
}

func interfaceEncoder(e *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	if v.IsNil() {
		return append(b, "null"...), nil
	}
	el := v.Elem()
	return typeEncoder(el.Type())(e, b, el, depth+1)
}

func bytesEncoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	if v.IsNil() {
		return append(b, "null"...), nil
	}
	return AppendString(b, base64.StdEncoding.EncodeToString(v.Bytes())), nil
}

func sliceEncoder(t reflect.Type) encoderFunc {
	arr := arrayEncoder(t)
	return func(e *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
		if depth > maxCanonDepth {
			return nil, errCanonDepth
		}
		if v.IsNil() {
			return append(b, "null"...), nil
		}
		return arr(e, b, v, depth)
	}
}

func arrayEncoder(t reflect.Type) encoderFunc {
	elem := typeEncoder(t.Elem())
	return func(e *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
		if depth > maxCanonDepth {
			return nil, errCanonDepth
		}
		b = append(b, '[')
		for i := range v.Len() {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = elem(e, b, v.Index(i), depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	}
}

func mapEncoder(t reflect.Type) encoderFunc {
	if t.Key().Kind() != reflect.String {
		return func(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
			if depth > maxCanonDepth {
				return nil, errCanonDepth
			}
			if v.IsNil() {
				return append(b, "null"...), nil
			}
			return nil, fmt.Errorf("jsonkit: canonical: unsupported map key type %s", t.Key())
		}
	}
	elem := typeEncoder(t.Elem())
	type entry struct {
		key string
		val reflect.Value
	}
	return func(e *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
		if depth > maxCanonDepth {
			return nil, errCanonDepth
		}
		track := e.track
		e.track = false
		if v.IsNil() {
			return append(b, "null"...), nil
		}
		entries := make([]entry, 0, v.Len())
		iter := v.MapRange()
		for iter.Next() {
			k := iter.Key().String()
			if !utf8.ValidString(k) {
				k = strings.ToValidUTF8(k, "\uFFFD")
			}
			entries = append(entries, entry{k, iter.Value()})
		}
		slices.SortFunc(entries, func(a, b entry) int { return compareUTF16(a.key, b.key) })
		for i := 1; i < len(entries); i++ {
			if entries[i].key == entries[i-1].key {
				return nil, fmt.Errorf("jsonkit: canonical: map keys collide after UTF-8 repair: %q", entries[i].key)
			}
		}
		b = append(b, '{')
		for i, en := range entries {
			if i > 0 {
				b = append(b, ',')
			}
			if track && e.at < 0 {
				if c := compareUTF16(en.key, e.key); c >= 0 {
					e.at, e.found = len(b), c == 0
				}
			}
			b = AppendString(b, en.key)
			b = append(b, ':')
			var err error
			if b, err = elem(e, b, en.val, depth+1); err != nil {
				return nil, err
			}
		}
		if track && e.at < 0 {
			e.at = len(b)
		}
		return append(b, '}'), nil
	}
}

func structEncoder(t reflect.Type) encoderFunc {
	info, err := structInfoOf(t)
	if err != nil {
		return func(_ *canonEncoder, _ []byte, _ reflect.Value, depth int) ([]byte, error) {
			if depth > maxCanonDepth {
				return nil, errCanonDepth
			}
			return nil, err
		}
	}
	return func(e *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
		if depth > maxCanonDepth {
			return nil, errCanonDepth
		}
		track := e.track
		e.track = false
		b = append(b, '{')
		first := true
		for i := range info.fields {
			f := &info.fields[i]
			fv := v.Field(f.index)
			if f.omitEmpty && f.isEmpty(fv) {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			if track && e.at < 0 {
				if c := compareUTF16(f.name, e.key); c >= 0 {
					e.at, e.found = len(b), c == 0
				}
			}
			b = append(b, f.quotedName...)
			if f.plainString && depth < maxCanonDepth {
				b = AppendString(b, fv.String())
				continue
			}
			var err error
			if b, err = f.enc(e, b, fv, depth+1); err != nil {
				return nil, err
			}
		}
		if track && e.at < 0 {
			e.at = len(b)
		}
		return append(b, '}'), nil
	}
}

func marshalerEncoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	return appendMarshaler(b, v)
}

func addrMarshalerEncoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	return appendMarshaler(b, v.Addr())
}

func textMarshalerEncoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	return appendTextMarshaler(b, v)
}

func addrTextMarshalerEncoder(_ *canonEncoder, b []byte, v reflect.Value, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errCanonDepth
	}
	return appendTextMarshaler(b, v.Addr())
}

func appendMarshaler(b []byte, v reflect.Value) ([]byte, error) {
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return append(b, "null"...), nil
	}
	m := v.Interface().(json.Marshaler)
	raw, err := m.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("jsonkit: canonical: %s.MarshalJSON: %w", v.Type(), err)
	}
	c, err := Canonicalize(raw)
	if err != nil {
		return nil, fmt.Errorf("jsonkit: canonical: %s: %w", v.Type(), err)
	}
	return append(b, c...), nil
}

func appendTextMarshaler(b []byte, v reflect.Value) ([]byte, error) {
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return append(b, "null"...), nil
	}
	text, err := v.Interface().(encoding.TextMarshaler).MarshalText()
	if err != nil {
		return nil, fmt.Errorf("jsonkit: canonical: %s.MarshalText: %w", v.Type(), err)
	}
	return AppendString(b, string(text)), nil
}

// emptyFunc is encoding/json's definition of empty for omitempty, for one
// kind.
func emptyFunc(k reflect.Kind) func(reflect.Value) bool {
	switch k {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return func(v reflect.Value) bool { return v.Len() == 0 }
	case reflect.Bool:
		return func(v reflect.Value) bool { return !v.Bool() }
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return func(v reflect.Value) bool { return v.Int() == 0 }
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return func(v reflect.Value) bool { return v.Uint() == 0 }
	case reflect.Float32, reflect.Float64:
		return func(v reflect.Value) bool { return v.Float() == 0 }
	case reflect.Interface, reflect.Pointer:
		return func(v reflect.Value) bool { return v.IsNil() }
	}
	return func(reflect.Value) bool { return false }
}

type fieldInfo struct {
	index      int
	name       string
	quotedName []byte // canonical JSON string of the member name, then ':'
	omitEmpty  bool
	isEmpty    func(reflect.Value) bool
	enc        encoderFunc
	// plainString is set for a string field without a marshaler of its
	// own, which the struct encoder writes itself.
	plainString bool
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
	c, _ := structCache.LoadOrStore(t, info)
	return c.(*structInfo), nil
}

func buildStructInfo(t reflect.Type) (*structInfo, error) {
	var fs []fieldInfo
	seen := map[string]bool{}
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		if sf.Anonymous {
			return nil, fmt.Errorf("jsonkit: canonical: %s: embedded field %s is not supported", t, sf.Name)
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
				return nil, fmt.Errorf("jsonkit: canonical: %s.%s: tag option %q is not supported", t, sf.Name, o)
			}
		}
		if seen[name] {
			return nil, fmt.Errorf("jsonkit: canonical: %s: duplicate JSON name %q", t, name)
		}
		seen[name] = true
		fs = append(fs, fieldInfo{index: i, name: name, quotedName: append(AppendString(nil, name), ':'),
			omitEmpty: omit, isEmpty: emptyFunc(sf.Type.Kind()), enc: typeEncoder(sf.Type),
			plainString: sf.Type.Kind() == reflect.String && !implementsAny(sf.Type, marshalerType, textMarshalerType)})
	}
	slices.SortFunc(fs, func(a, b fieldInfo) int { return compareUTF16(a.name, b.name) })
	return &structInfo{fields: fs}, nil
}

// compareUTF16 orders strings by their UTF-16 code units, as RFC 8785
// sorts object members.
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

// AppendString appends s to dst as an RFC 8785 string, as MarshalCanonical
// writes a Go string: the JSON escapes \" \\ \b \f \n \r \t, \u00xx for
// other control characters, everything else literal; each byte of invalid
// UTF-8 is replaced by U+FFFD, as encoding/json does. The result is also
// valid JSON for any decoder, so hand-written encoders of wire records use
// it for their strings.
func AppendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		// Most of a receipt is hex, ids and names: skip plain ASCII
		// eight bytes at a time.
		if i = PlainRun(s, i); i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
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
