package schemas

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// quickSchema is a JSON Schema (draft 2020-12) compiled for a quick
// validity check of decoded trees (objects map[string]any, arrays []any,
// numbers json.Number). It is built from the schema document itself and
// understands only the keywords in quickKeywords; compileQuickSchema
// refuses a schema that uses any other keyword, so a schema file that
// grows a keyword this check does not know cannot be half-checked.
//
// Its answers are sound, not complete: quickValid means the jsonschema
// library accepts the instance, quickInvalid means the library rejects it,
// and quickUnknown means ask the library. The parser asks the library for
// anything but quickValid, so a rejected document always gets the
// library's error details.
type quickSchema struct {
	never    bool     // the false schema
	types    typeMask // 0: any type
	enum     []any    // const or enum; nil: none (values are strings, booleans or null)
	hasEnum  bool
	minLen   int // -1: none
	maxLen   int // -1: none
	pattern  func(string) bool
	dateTime bool
	required []string
	props    map[string]*quickSchema
	// propList is props in a fixed order, each with whether it is also
	// required; reqOther are the required names props does not declare.
	propList   []quickProp
	reqOther   []string
	additional *quickSchema // nil: absent
	// unevaluatedFalse is "unevaluatedProperties": false. The check knows a
	// member was evaluated only when properties or additionalProperties of
	// the same schema object covered it; anything else is quickUnknown.
	unevaluatedFalse bool
	items            *quickSchema
	ifS, thenS, elsS *quickSchema
	ref              *quickSchema
}

type quickProp struct {
	name     string
	schema   *quickSchema
	required bool
}

type quickResult uint8

const (
	quickValid quickResult = iota
	quickUnknown
	quickInvalid
)

type typeMask uint8

const (
	typeNull typeMask = 1 << iota
	typeBoolean
	typeObject
	typeArray
	typeNumber
	typeInteger
	typeString
)

var typeNames = map[string]typeMask{
	"null": typeNull, "boolean": typeBoolean, "object": typeObject, "array": typeArray,
	"number": typeNumber, "integer": typeInteger, "string": typeString,
}

// quickKeywords are the keywords compileQuickSchema understands. Keywords
// that only annotate are listed too; they never change a verdict.
var quickKeywords = map[string]bool{
	"$schema": true, "$id": true, "$defs": true, "$ref": true, "$comment": true,
	"title": true, "description": true, "examples": true, "default": true, "deprecated": true,
	"readOnly": true, "writeOnly": true,
	"type": true, "const": true, "enum": true,
	"minLength": true, "maxLength": true, "pattern": true, "format": true,
	"required": true, "properties": true, "additionalProperties": true, "unevaluatedProperties": true,
	"items": true, "if": true, "then": true, "else": true,
}

// quickPatterns are hand-written matchers for the exact regular
// expressions the envelope schema uses, each equivalent to Go's regexp
// (which the jsonschema library uses) on valid UTF-8. A pattern not listed
// here is compiled with regexp: still exact, only slower.
var quickPatterns = map[string]func(string) bool{
	`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`: isUUIDString,
	`^[a-z0-9][a-z0-9_-]{0,63}$`: isIDString,
	`^[A-Za-z0-9_-]{22,256}$`:    isCorrelationID,
	`^[0-9a-f]{64}$`:             isHex256,
	`^sha256:[0-9a-f]{64}$`:      isDigestString,
	`^(/([^~/]|~[01])*)*$`:       jsonkit.ValidPointer,
	`^/`:                         isAbsolutePath,
}

// compileQuickSchema compiles the schema document doc (as
// jsonschema.UnmarshalJSON decodes it). It fails on any keyword outside
// quickKeywords, any $ref outside doc, a format other than date-time and a
// const or enum value that is not a string, boolean or null.
func compileQuickSchema(doc any) (*quickSchema, error) {
	c := &quickCompiler{root: doc, byPtr: map[string]*quickSchema{}}
	s, err := c.compile(doc, "")
	if err != nil {
		return nil, err
	}
	for _, n := range c.byPtr {
		n.index()
	}
	return s, nil
}

// index builds propList and reqOther from props and required.
func (s *quickSchema) index() {
	req := map[string]bool{}
	for _, r := range s.required {
		req[r] = true
	}
	for name, sub := range s.props {
		s.propList = append(s.propList, quickProp{name: name, schema: sub, required: req[name]})
		delete(req, name)
	}
	slices.SortFunc(s.propList, func(a, b quickProp) int { return strings.Compare(a.name, b.name) })
	for _, r := range s.required {
		if req[r] {
			s.reqOther = append(s.reqOther, r)
			delete(req, r)
		}
	}
}

type quickCompiler struct {
	root  any
	byPtr map[string]*quickSchema
}

func (c *quickCompiler) compile(v any, ptr string) (*quickSchema, error) {
	if s, ok := c.byPtr[ptr]; ok {
		return s, nil
	}
	s := &quickSchema{minLen: -1, maxLen: -1}
	c.byPtr[ptr] = s
	switch v := v.(type) {
	case bool:
		s.never = !v
		return s, nil
	case map[string]any:
		return s, c.fill(s, v, ptr)
	}
	return nil, fmt.Errorf("schemas: quick check: %s: not a schema", ptrOrRoot(ptr))
}

func ptrOrRoot(ptr string) string {
	if ptr == "" {
		return "#"
	}
	return "#" + ptr
}

func (c *quickCompiler) fill(s *quickSchema, m map[string]any, ptr string) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys) // deterministic errors
	for _, kw := range keys {
		val := m[kw]
		if !quickKeywords[kw] {
			return quickError(ptr, kw, "keyword unknown to the quick check")
		}
		switch kw {
		case "type", "const", "enum", "minLength", "maxLength", "pattern", "format", "required":
			if why := s.assertion(kw, val); why != "" {
				return quickError(ptr, kw, why)
			}
		default:
			if err := c.applicator(s, kw, val, ptr); err != nil {
				return err
			}
		}
	}
	return nil
}

// quickError is the error of keyword kw of the schema at ptr.
func quickError(ptr, kw, why string) error {
	return fmt.Errorf("schemas: quick check: %s/%s: %s", ptrOrRoot(ptr), kw, why)
}

// applicator compiles into s the keyword kw of the schema at ptr that
// places the document ($schema, $id), names or references schemas ($defs,
// $ref) or applies subschemas (properties, items, if/then/else, …);
// annotations (title, description, …) compile to nothing.
func (c *quickCompiler) applicator(s *quickSchema, kw string, val any, ptr string) error {
	sub := func(p string, v any) (*quickSchema, error) { return c.compile(v, ptr+"/"+p) }
	var err error
	switch kw {
	case "$schema":
		if ptr != "" || val != "https://json-schema.org/draft/2020-12/schema" {
			return quickError(ptr, kw, "only draft 2020-12, at the root")
		}
	case "$id":
		if ptr != "" {
			return quickError(ptr, kw, "only at the root")
		}
	case "$defs":
		defs, ok := val.(map[string]any)
		if !ok {
			return quickError(ptr, kw, "not an object")
		}
		for name, d := range defs {
			if _, err := sub("$defs/"+jsonkit.EscapeToken(name), d); err != nil {
				return err
			}
		}
	case "$ref":
		ref, _ := val.(string)
		target, ok := strings.CutPrefix(ref, "#")
		if !ok {
			return quickError(ptr, kw, "only references into the same document")
		}
		node, found := jsonkit.ResolvePointer(c.root, target)
		if !found {
			return quickError(ptr, kw, "does not resolve")
		}
		s.ref, err = c.compile(node, target)
	case "properties":
		props, ok := val.(map[string]any)
		if !ok {
			return quickError(ptr, kw, "not an object")
		}
		s.props = make(map[string]*quickSchema, len(props))
		for name, p := range props {
			if s.props[name], err = sub("properties/"+jsonkit.EscapeToken(name), p); err != nil {
				return err
			}
		}
	case "additionalProperties":
		s.additional, err = sub(kw, val)
	case "unevaluatedProperties":
		if val != false {
			return quickError(ptr, kw, "only false")
		}
		s.unevaluatedFalse = true
	case "items":
		s.items, err = sub(kw, val)
	case "if":
		s.ifS, err = sub(kw, val)
	case "then":
		s.thenS, err = sub(kw, val)
	case "else":
		s.elsS, err = sub(kw, val)
	}
	return err
}

// assertion compiles into s the keyword kw that asserts something of the
// instance itself (type, const/enum, lengths, pattern, format, required).
// It returns why kw cannot be compiled, or "".
func (s *quickSchema) assertion(kw string, val any) string {
	switch kw {
	case "type":
		switch t := val.(type) {
		case string:
			if s.types = typeNames[t]; s.types == 0 {
				return "unknown type"
			}
		case []any:
			for _, x := range t {
				name, _ := x.(string)
				if typeNames[name] == 0 {
					return "unknown type"
				}
				s.types |= typeNames[name]
			}
		default:
			return "not a string or array"
		}
	case "const", "enum":
		vals := []any{val}
		if kw == "enum" {
			var ok bool
			if vals, ok = val.([]any); !ok {
				return "not an array"
			}
		}
		for _, x := range vals {
			switch x.(type) {
			case string, bool, nil:
			default:
				return "only strings, booleans and null"
			}
		}
		if s.hasEnum {
			return "both const and enum"
		}
		s.enum, s.hasEnum = vals, true
	case "minLength", "maxLength":
		n, ok := schemaInt(val)
		if !ok {
			return "not a non-negative integer"
		}
		if kw == "minLength" {
			s.minLen = n
		} else {
			s.maxLen = n
		}
	case "pattern":
		p, _ := val.(string)
		if s.pattern = quickPatterns[p]; s.pattern == nil {
			re, err := regexp.Compile(p)
			if err != nil {
				return err.Error()
			}
			s.pattern = re.MatchString
		}
	case "format":
		if val != "date-time" {
			return "only date-time"
		}
		s.dateTime = true
	case "required":
		rs, ok := val.([]any)
		if !ok {
			return "not an array"
		}
		for _, r := range rs {
			name, ok := r.(string)
			if !ok {
				return "not an array of strings"
			}
			s.required = append(s.required, name)
		}
	}
	return ""
}

func schemaInt(v any) (int, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	if err != nil || i < 0 || i > 1<<30 {
		return 0, false
	}
	return int(i), true
}

// quickRefDepth bounds $ref chains that do not descend into the instance.
const quickRefDepth = 64

// check answers whether v is valid against s (see quickSchema).
func (s *quickSchema) check(v any) quickResult { return s.eval(v, 0) }

func (s *quickSchema) eval(v any, refs int) quickResult {
	if s.never {
		return quickInvalid
	}
	r := quickValid
	if s.ref != nil {
		if refs >= quickRefDepth {
			return quickUnknown
		}
		if r = s.ref.eval(v, refs+1); r == quickInvalid {
			return r
		}
	}
	if s.types != 0 {
		if t := s.typeOK(v); t != quickValid {
			if t == quickInvalid {
				return t
			}
			r = quickUnknown
		}
	}
	if s.hasEnum && !slices.Contains(s.enum, v) {
		return quickInvalid
	}
	switch x := v.(type) {
	case string:
		if s.minLen >= 0 || s.maxLen >= 0 {
			n := utf8.RuneCountInString(x)
			if (s.minLen >= 0 && n < s.minLen) || (s.maxLen >= 0 && n > s.maxLen) {
				return quickInvalid
			}
		}
		if s.pattern != nil && !s.pattern(x) {
			return quickInvalid
		}
		if s.dateTime && !isPlainDateTime(x) {
			r = quickUnknown
		}
	case map[string]any:
		if o := s.object(x); o != quickValid {
			if o == quickInvalid {
				return o
			}
			r = quickUnknown
		}
	case []any:
		if s.items != nil {
			for _, e := range x {
				switch s.items.eval(e, 0) {
				case quickInvalid:
					return quickInvalid
				case quickUnknown:
					r = quickUnknown
				}
			}
		}
	}
	if s.ifS != nil {
		var branch *quickSchema
		switch s.ifS.eval(v, refs) {
		case quickValid:
			branch = s.thenS
		case quickInvalid:
			branch = s.elsS
		default:
			return quickUnknown
		}
		if branch != nil {
			switch branch.eval(v, refs) {
			case quickInvalid:
				return quickInvalid
			case quickUnknown:
				r = quickUnknown
			}
		}
	}
	return r
}

// object applies required, properties, additionalProperties and
// unevaluatedProperties to an object. It looks the declared properties up
// in the instance rather than ranging over the instance: a member the
// declared ones do not account for shows as a count that does not add up.
func (s *quickSchema) object(x map[string]any) quickResult {
	for _, name := range s.reqOther {
		if _, ok := x[name]; !ok {
			return quickInvalid
		}
	}
	r := quickValid
	found := 0
	for i := range s.propList {
		p := &s.propList[i]
		mv, ok := x[p.name]
		if !ok {
			if p.required {
				return quickInvalid
			}
			continue
		}
		found++
		switch p.schema.eval(mv, 0) {
		case quickInvalid:
			return quickInvalid
		case quickUnknown:
			r = quickUnknown
		}
	}
	if found == len(x) {
		return r
	}
	// Members no declared property covers.
	switch {
	case s.additional != nil && s.additional.never:
		return quickInvalid
	case s.additional != nil:
		for k, mv := range x {
			if _, declared := s.props[k]; declared {
				continue
			}
			switch s.additional.eval(mv, 0) {
			case quickInvalid:
				return quickInvalid
			case quickUnknown:
				r = quickUnknown
			}
		}
		return r
	case s.unevaluatedFalse:
		return quickUnknown
	}
	return r
}

// typeOK checks the type keyword. An integer-valued number written with a
// fraction or an exponent (1.0, 1e2) is left to the library.
func (s *quickSchema) typeOK(v any) quickResult {
	var t typeMask
	switch x := v.(type) {
	case nil:
		t = typeNull
	case bool:
		t = typeBoolean
	case string:
		t = typeString
	case map[string]any:
		t = typeObject
	case []any:
		t = typeArray
	case json.Number:
		if s.types&typeNumber != 0 {
			return quickValid
		}
		if s.types&typeInteger == 0 {
			return quickInvalid
		}
		if strings.ContainsAny(string(x), ".eE") {
			return quickUnknown
		}
		return quickValid
	default:
		return quickUnknown
	}
	if s.types&t != 0 {
		return quickValid
	}
	return quickInvalid
}

func isHexDigits(s string, lowerOnly bool) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case !lowerOnly && c >= 'A' && c <= 'F':
		default:
			return false
		}
	}
	return true
}

func isUUIDString(s string) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	return isHexDigits(s[0:8], false) && isHexDigits(s[9:13], false) && isHexDigits(s[14:18], false) &&
		isHexDigits(s[19:23], false) && isHexDigits(s[24:], false)
}

func isIDString(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '_' || c == '-'):
		default:
			return false
		}
	}
	return true
}

func isCorrelationID(s string) bool {
	if len(s) < 22 || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

func isHex256(s string) bool { return len(s) == 64 && isHexDigits(s, true) }

func isAbsolutePath(s string) bool { return strings.HasPrefix(s, "/") }

func isDigestString(s string) bool {
	d, ok := strings.CutPrefix(s, "sha256:")
	return ok && isHex256(d)
}

// isPlainDateTime accepts the usual RFC 3339 shapes the library's
// date-time format accepts: YYYY-MM-DD[Tt]hh:mm:ss[.frac]([Zz]|±hh:mm)
// with a real calendar date, hour ≤ 23, minute ≤ 59, second ≤ 59 (a leap
// second is left to the library), offset hour ≤ 23 and minute ≤ 59.
func isPlainDateTime(s string) bool {
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't') || s[13] != ':' || s[16] != ':' {
		return false
	}
	year, ok1 := digitsAt(s, 0, 4)
	month, ok2 := digitsAt(s, 5, 2)
	day, ok3 := digitsAt(s, 8, 2)
	hour, ok4 := digitsAt(s, 11, 2)
	minute, ok5 := digitsAt(s, 14, 2)
	sec, ok6 := digitsAt(s, 17, 2)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return false
	}
	if month < 1 || month > 12 || day < 1 || day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return false
	}
	rest := s[19:]
	if len(rest) > 0 && rest[0] == '.' {
		n := 1
		for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
			n++
		}
		if n == 1 {
			return false
		}
		rest = rest[n:]
	}
	switch {
	case rest == "Z" || rest == "z":
		return true
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		oh, ok1 := digitsAt(rest, 1, 2)
		om, ok2 := digitsAt(rest, 4, 2)
		return ok1 && ok2 && oh <= 23 && om <= 59
	}
	return false
}

func digitsAt(s string, i, n int) (int, bool) {
	v := 0
	for _, c := range []byte(s[i : i+n]) {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}
