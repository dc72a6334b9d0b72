package verify

import (
	"bytes"
	"encoding"
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// This file reads canonical JSON (already checked by jsonkit.IsCanonicalObject)
// into Go values the way encoding/json's Unmarshal does, for the shapes
// Talos signs: structs of strings, bools, integers, pointers and slices.
// It exists so the verifier parses each event once, in one pass, instead
// of canonicalizing it and then running encoding/json over it.
//
// It never guesses: for anything whose encoding/json result it does not
// reproduce exactly (a member name matching a field only case-
// insensitively, a value of the wrong JSON type, an integer out of range,
// floats, maps, interfaces, []byte, arrays, types with their own
// UnmarshalJSON or UnmarshalText but json.RawMessage, embedded fields, the ",string" option),
// it reports false, and the caller decodes with encoding/json instead.

// canonDecoder reads b, whose text is also s (the same bytes as a string,
// so that unescaped strings are substrings of s rather than copies), or
// s is "" and every string is a copy.
type canonDecoder struct {
	b []byte
	s string
	i int

	// With track set, the first struct read (the top-level object)
	// records the range of its "signature" member: the member starts at
	// sigStart (its name), its value at sigValStart, and it ends at
	// sigEnd; sigStart stays -1 if there is none.
	track                         bool
	sigStart, sigValStart, sigEnd int
}

// text is the string b[start:end].
func (d *canonDecoder) text(start, end int) string {
	if d.s == "" {
		return string(d.b[start:end])
	}
	return d.s[start:end]
}

// decodeFunc decodes the value at d.b[d.i] into v (settable), advancing
// d.i past it, or reports false.
type decodeFunc func(d *canonDecoder, v reflect.Value) bool

// decodeCanonical decodes the canonical JSON value b[i:end] (whose text
// is also s, or s is "") into *ptr, as json.Unmarshal would. On false,
// *ptr is in an unspecified state.
func decodeCanonical(b []byte, s string, i, end int, ptr any) bool {
	rv := reflect.ValueOf(ptr)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return false
	}
	d := canonDecoder{b: b[:end], s: s[:min(end, len(s))], i: i}
	return typeDecoder(rv.Type().Elem())(&d, rv.Elem()) && d.i == end
}

// decodeSigned is decodeCanonical for the data object of a signed event:
// it also returns the range of its "signature" member (start -1 if none),
// as findMember would find it.
func decodeSigned(b []byte, s string, i, end int, ptr any) (sigStart, sigValStart, sigEnd int, ok bool) {
	rv := reflect.ValueOf(ptr)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return -1, 0, 0, false
	}
	d := canonDecoder{b: b[:end], s: s[:min(end, len(s))], i: i, track: true, sigStart: -1}
	ok = typeDecoder(rv.Type().Elem())(&d, rv.Elem()) && d.i == end
	return d.sigStart, d.sigValStart, d.sigEnd, ok
}

var decoderCache sync.Map // reflect.Type → decodeFunc; a pure function cache

func typeDecoder(t reflect.Type) decodeFunc {
	if f, ok := decoderCache.Load(t); ok {
		return f.(decodeFunc)
	}
	var (
		wg sync.WaitGroup
		f  decodeFunc
	)
	wg.Add(1)
	fi, loaded := decoderCache.LoadOrStore(t, decodeFunc(func(d *canonDecoder, v reflect.Value) bool {
		wg.Wait()
		return f(d, v)
	}))
	if loaded {
		return fi.(decodeFunc)
	}
	f = newTypeDecoder(t)
	wg.Done()
	decoderCache.Store(t, f)
	return f
}

var (
	unmarshalerType     = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func unsupported(*canonDecoder, reflect.Value) bool { return false }

var (
	rawMessageType = reflect.TypeFor[json.RawMessage]()
	canonicalType  = reflect.TypeFor[jsonkit.Canonical]()
)

// decodeRawMessage keeps a copy of the value's bytes, null included, as
// json.RawMessage's (and jsonkit.Canonical's) UnmarshalJSON does.
func decodeRawMessage(d *canonDecoder, v reflect.Value) bool {
	end, err := jsonkit.SkipValue(d.b, d.i)
	if err != nil {
		return false
	}
	v.SetBytes(append([]byte(nil), d.b[d.i:end]...))
	d.i = end
	return true
}

func newTypeDecoder(t reflect.Type) decodeFunc {
	if t == rawMessageType || t == canonicalType {
		return decodeRawMessage
	}
	if t.Kind() != reflect.Pointer && (reflect.PointerTo(t).Implements(unmarshalerType) || reflect.PointerTo(t).Implements(textUnmarshalerType)) ||
		t.Implements(unmarshalerType) || t.Implements(textUnmarshalerType) {
		return unsupported
	}
	switch t.Kind() {
	case reflect.String:
		return decodeString
	case reflect.Bool:
		return decodeBool
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return decodeInt
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return decodeUint
	case reflect.Pointer:
		return pointerDecoder(t)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return unsupported
		}
		return sliceDecoder(t)
	case reflect.Struct:
		return structDecoder(t)
	}
	return unsupported
}

// null consumes a JSON null.
func (d *canonDecoder) null() bool {
	if d.i < len(d.b) && d.b[d.i] == 'n' {
		d.i += len("null")
		return true
	}
	return false
}

func decodeString(d *canonDecoder, v reflect.Value) bool {
	if d.null() {
		return true
	}
	s, ok := d.str()
	if ok {
		v.SetString(s)
	}
	return ok
}

// str reads a JSON string.
func (d *canonDecoder) str() (string, bool) {
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return "", false
	}
	start := d.i + 1
	i := jsonkit.QuoteRun(d.b, start)
	switch {
	case i >= len(d.b):
		return "", false
	case d.b[i] == '"':
		d.i = i + 1
		return d.text(start, i), true
	}
	end, err := jsonkit.SkipString(d.b, d.i)
	if err != nil {
		return "", false
	}
	d.i = end
	return jsonkit.Unescape(d.b[start : end-1]), true
}

func decodeBool(d *canonDecoder, v reflect.Value) bool {
	switch {
	case d.null():
	case bytes.HasPrefix(d.b[d.i:], []byte("true")):
		v.SetBool(true)
		d.i += len("true")
	case bytes.HasPrefix(d.b[d.i:], []byte("false")):
		v.SetBool(false)
		d.i += len("false")
	default:
		return false
	}
	return true
}

// number reads a number token.
func (d *canonDecoder) number() (string, bool) {
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		if c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' {
			d.i++
			continue
		}
		break
	}
	return d.text(start, d.i), d.i > start && (d.b[start] == '-' || d.b[start] >= '0' && d.b[start] <= '9')
}

func decodeInt(d *canonDecoder, v reflect.Value) bool {
	if d.null() {
		return true
	}
	tok, ok := d.number()
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(tok, 10, 64)
	if err != nil || v.OverflowInt(n) {
		return false
	}
	v.SetInt(n)
	return true
}

func decodeUint(d *canonDecoder, v reflect.Value) bool {
	if d.null() {
		return true
	}
	tok, ok := d.number()
	if !ok {
		return false
	}
	n, err := strconv.ParseUint(tok, 10, 64)
	if err != nil || v.OverflowUint(n) {
		return false
	}
	v.SetUint(n)
	return true
}

func pointerDecoder(t reflect.Type) decodeFunc {
	elem := typeDecoder(t.Elem())
	return func(d *canonDecoder, v reflect.Value) bool {
		if d.null() {
			v.SetZero()
			return true
		}
		if v.IsNil() {
			v.Set(reflect.New(t.Elem()))
		}
		return elem(d, v.Elem())
	}
}

func sliceDecoder(t reflect.Type) decodeFunc {
	elem := typeDecoder(t.Elem())
	return func(d *canonDecoder, v reflect.Value) bool {
		if d.null() {
			v.SetZero()
			return true
		}
		if d.i >= len(d.b) || d.b[d.i] != '[' {
			return false
		}
		d.i++
		s := reflect.MakeSlice(t, 0, 4)
		if d.i < len(d.b) && d.b[d.i] == ']' {
			d.i++
			v.Set(s)
			return true
		}
		for n := 0; ; n++ {
			if n == s.Cap() {
				s = reflect.AppendSlice(s, reflect.MakeSlice(t, n, n)).Slice(0, n)
			}
			s = s.Slice(0, n+1)
			if !elem(d, s.Index(n)) || d.i >= len(d.b) {
				return false
			}
			switch d.b[d.i] {
			case ',':
				d.i++
			case ']':
				d.i++
				v.Set(s)
				return true
			default:
				return false
			}
		}
	}
}

type decodeField struct {
	name  string
	index int
	dec   decodeFunc
}

func structDecoder(t reflect.Type) decodeFunc {
	fields, ok := decodeFields(t)
	if !ok {
		return unsupported
	}
	// Members come in RFC 8785 order, which for these names is byte
	// order: match them to the fields in one merge walk.
	return func(d *canonDecoder, v reflect.Value) bool {
		track := d.track
		d.track = false
		if d.null() {
			return true
		}
		if d.i >= len(d.b) || d.b[d.i] != '{' {
			return false
		}
		d.i++
		if d.i < len(d.b) && d.b[d.i] == '}' {
			d.i++
			return true
		}
		next, prev := 0, ""
		for first := true; ; first = false {
			keyStart := d.i
			key, ok := d.str()
			if !ok || d.i >= len(d.b) || d.b[d.i] != ':' || !first && key <= prev {
				return false
			}
			prev = key
			d.i++
			for next < len(fields) && fields[next].name < key {
				next++
			}
			if track && key == signatureKey {
				d.sigStart, d.sigValStart = keyStart, d.i
			}
			if next < len(fields) && fields[next].name == key {
				f := &fields[next]
				if !f.dec(d, v.Field(f.index)) {
					return false
				}
			} else {
				// encoding/json would fill a field whose name matches
				// this one case-insensitively: leave that to it.
				for i := range fields {
					if strings.EqualFold(fields[i].name, key) {
						return false
					}
				}
				end, err := jsonkit.SkipValue(d.b, d.i)
				if err != nil {
					return false
				}
				d.i = end
			}
			if track && key == signatureKey {
				d.sigEnd = d.i
			}
			if d.i >= len(d.b) {
				return false
			}
			switch d.b[d.i] {
			case ',':
				d.i++
			case '}':
				d.i++
				return true
			default:
				return false
			}
		}
	}
}

// decodeFields lists the fields of struct type t a decoder fills, sorted
// by member name. ok is false for a struct the decoder leaves to
// encoding/json: an embedded field, a ",string" option, a name that is not
// plain, or two fields of one name.
func decodeFields(t reflect.Type) ([]decodeField, bool) {
	var fields []decodeField
	byName := map[string]bool{}
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		if sf.Anonymous {
			return nil, false
		}
		if !sf.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		for o := range strings.SplitSeq(opts, ",") {
			if o == "string" {
				return nil, false
			}
		}
		if name == "" {
			name = sf.Name
		}
		if !plainName(name) {
			return nil, false
		}
		if byName[name] {
			return nil, false
		}
		byName[name] = true
		fields = append(fields, decodeField{name: name, index: i, dec: typeDecoder(sf.Type)})
	}
	slices.SortFunc(fields, func(a, b decodeField) int { return strings.Compare(a.name, b.name) })
	return fields, true
}

// plainName reports whether a JSON member name is letters, digits and
// underscores: a name encoding/json uses as given in the tag.
func plainName(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
