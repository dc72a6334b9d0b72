package redact

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/talos-audit/talos/schemas"
)

// Rule names Talos adds to the gitleaks rule IDs in findings.
const (
	// RuleFieldName marks a value replaced whole because of its member name
	// (or, in a name/value pair, the pair's name).
	RuleFieldName = "field-name"
	// RulePrivateKeyLines marks the elements of an array holding a PEM
	// private key one line per element.
	RulePrivateKeyLines = "private-key-lines"
	// SuffixBase64 is appended to the rule of a secret found inside
	// base64-encoded text; the whole base64 run is replaced.
	SuffixBase64 = "+base64"
	// SuffixJSON is appended to the rule of a secret found inside a JSON
	// document carried in a string; the finding's pointer is the string's.
	SuffixJSON = "+json"
)

// Limits.
const (
	// MaxDepth is the deepest container nesting Redact walks (JSON documents
	// decoded from strings count towards it).
	MaxDepth = 64
	// MinKeyBytes is the shortest pseudonym key New accepts.
	MinKeyBytes = 32
	// defaultDecodeDepth is Config.MaxDecodeDepth's zero value.
	defaultDecodeDepth = 2
	// maxDecodeDepth caps Config.MaxDecodeDepth.
	maxDecodeDepth = 8
	// shortHex is how many hex digits of the pseudonym a marker carries.
	shortHex = 12
)

// Errors callers branch on. Both mean the payload could not be redacted:
// the caller fails closed (retries or dead-letters, never stores the raw
// payload).
var (
	// ErrTooDeep: the tree nests containers deeper than MaxDepth.
	ErrTooDeep = errors.New("redact: payload nested deeper than 64 levels")
	// ErrUnsupportedType: the tree holds a Go value encoding/json does not
	// produce when decoding into any.
	ErrUnsupportedType = errors.New("redact: unsupported value type")
)

// DefaultFieldNames are the member names whose values are secrets whatever
// they look like. Names are compared lowercased with '-', '_' and ' '
// removed; an entry starting with '*' matches every name ending in the rest
// ("*token" matches "github_token", "X-Auth-Token"). New copies the list it
// uses; changing this variable affects only Redactors built afterwards.
var DefaultFieldNames = []string{
	"password", "passwd", "pwd", "passphrase",
	"token", "access_token", "refresh_token", "id_token", "auth_token",
	"session_token", "bearer_token", "api_token",
	"secret", "client_secret", "secret_key", "secret_access_key",
	"aws_secret_access_key",
	"authorization", "proxy-authorization",
	"api_key", "apikey", "x-api-key", "access_key",
	"private_key", "credentials", "credential",
	"cookie", "cookies", "set-cookie",
	"*password", "*passwd", "*passphrase", "*secret", "*token", "*apikey",
	"*secretkey", "*privatekey",
}

// pairNameKeys and pairValueKeys describe a name/value pair object
// ({"name": "Authorization", "value": "Bearer ..."}): when a member named
// like pairNameKeys holds a sensitive field name, the "value" member is
// redacted as if it were that field.
var (
	pairNameKeys  = []string{"name", "key", "header", "field"}
	pairValueKeys = []string{"value"}
)

// Config configures a Redactor. The zero value is not usable: Key is
// required.
type Config struct {
	// Key is the HMAC-SHA256 key of the pseudonyms, at least 32 bytes
	// (see LoadOrCreateKey).
	Key []byte
	// KeyID names Key in pseudonyms; "" means the first 16 hex digits of
	// sha256(Key). It must not contain ':' or whitespace.
	KeyID string
	// FieldNames replaces DefaultFieldNames when non-nil.
	FieldNames []string
	// ExtraFieldNames are added to the field names in use.
	ExtraFieldNames []string
	// MaxDecodeDepth bounds how many nested decodings (base64 text, JSON
	// documents in strings) a value goes through: 0 means 2, a negative
	// value disables decoding, at most 8.
	MaxDecodeDepth int
}

// Finding is one replaced secret: where (an RFC 6901 pointer under the
// base given to Redact), which rule found it, and its keyed pseudonym.
type Finding = schemas.Redaction

// Redactor replaces secrets in JSON trees. It is immutable and safe for
// concurrent use; build one per key and reuse it.
type Redactor struct {
	key         []byte
	kid         string
	exact       map[string]struct{}
	suffixes    []string
	decodeDepth int
	rules       *ruleset
}

// New validates cfg and builds a Redactor. The detection ruleset is
// compiled on the first call in the process and shared afterwards.
func New(cfg Config) (*Redactor, error) {
	if len(cfg.Key) < MinKeyBytes {
		return nil, fmt.Errorf("redact: key must be at least %d bytes, got %d", MinKeyBytes, len(cfg.Key))
	}
	kid := cfg.KeyID
	if kid == "" {
		kid = DefaultKeyID(cfg.Key)
	}
	if strings.ContainsAny(kid, ": \t\r\n") {
		return nil, errors.New("redact: key id must not contain ':' or whitespace")
	}
	depth := cfg.MaxDecodeDepth
	switch {
	case depth == 0:
		depth = defaultDecodeDepth
	case depth < 0:
		depth = 0
	case depth > maxDecodeDepth:
		return nil, fmt.Errorf("redact: MaxDecodeDepth %d exceeds %d", depth, maxDecodeDepth)
	}
	names := cfg.FieldNames
	if names == nil {
		names = DefaultFieldNames
	}
	r := &Redactor{
		key:         append([]byte(nil), cfg.Key...),
		kid:         kid,
		exact:       map[string]struct{}{},
		decodeDepth: depth,
	}
	for _, n := range append(append([]string(nil), names...), cfg.ExtraFieldNames...) {
		suffix := strings.HasPrefix(n, "*")
		norm := normalizeName(strings.TrimPrefix(n, "*"))
		if norm == "" {
			return nil, fmt.Errorf("redact: empty field name %q", n)
		}
		if suffix {
			r.suffixes = append(r.suffixes, norm)
		} else {
			r.exact[norm] = struct{}{}
		}
	}
	rs, err := loadRuleset()
	if err != nil {
		return nil, err
	}
	r.rules = rs
	return r, nil
}

// DefaultKeyID is the key id used when Config.KeyID is empty: the first 16
// hex digits of sha256(key).
func DefaultKeyID(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// KeyID names the pseudonym key.
func (r *Redactor) KeyID() string { return r.kid }

// RuleIDs lists the detection rules in use (gitleaks' and Talos's gap
// fillers), in evaluation order, without the structural rules.
func (r *Redactor) RuleIDs() []string {
	ids := make([]string, len(r.rules.rules))
	for i, rule := range r.rules.rules {
		ids[i] = rule.id
	}
	return ids
}

// Pseudonym is "hmac-sha256:<key_id>:<hex>", HMAC-SHA256 under the
// Redactor's key of the exact bytes of secret. It is what findings carry
// and what `talosctl query secret-uses` computes from a value.
func (r *Redactor) Pseudonym(secret string) string {
	return "hmac-sha256:" + r.kid + ":" + r.mac(secret)
}

func (r *Redactor) mac(secret string) string {
	m := hmac.New(sha256.New, r.key)
	m.Write([]byte(secret))
	return hex.EncodeToString(m.Sum(nil))
}

// isSensitive reports whether a member name is a configured field name.
func (r *Redactor) isSensitive(name string) bool {
	var buf [64]byte
	n := appendNormalized(buf[:0], name)
	if _, ok := r.exact[string(n)]; ok {
		return true
	}
	for _, s := range r.suffixes {
		if bytes.HasSuffix(n, []byte(s)) {
			return true
		}
	}
	return false
}

// normalizeName lowercases ASCII letters and drops '-', '_' and ' '.
func normalizeName(s string) string { return string(appendNormalized(nil, s)) }

func appendNormalized(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '-' || c == '_' || c == ' ':
			continue
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// Redact returns a deep copy of v (a JSON tree as encoding/json decodes it,
// with or without UseNumber: map[string]any, []any, string, float64,
// json.Number, bool, nil) in which every secret found is replaced by
// "[REDACTED:<rule>:<12 hex>]", and the findings sorted by pointer, rule and
// pseudonym. base prefixes every pointer (e.g. "/args"). v is never
// modified.
//
// What is replaced:
//   - in a string, the secret part a rule identifies (the password of
//     https://u:pw@host, the token after "Bearer "); overlapping findings
//     merge into one replacement;
//   - a string or number under a sensitive member name, whole; every string
//     and number inside an object or array under such a name;
//   - a base64 run (16 or more characters) whose decoding is printable text
//     holding a secret, whole (rule "<rule>+base64");
//   - in a string holding a JSON object or array with secrets inside: the
//     string becomes the redacted document re-serialized (keys sorted, no
//     HTML escaping; rule "<rule>+json", pointer of the string). Re-encoding
//     rather than replacing substrings of the original text is deliberate:
//     a secret may appear escaped in JSON text ("\/", "\u0041", "\n" in a
//     PEM key) and a substring replacement would miss it;
//   - every element of an array from a line "-----BEGIN ... PRIVATE KEY-----"
//     to the matching END line ("private-key-lines");
//   - an object key holding a secret (the pointer then names the redacted
//     key).
//
// Decoding suffixes accumulate from the inside out: "field-name+json+base64"
// is a password member of a JSON document that was base64-encoded in the
// string at the pointer.
//
// Booleans, nulls and empty strings are never replaced. Redact fails only
// with ErrTooDeep or ErrUnsupportedType (wrapped); its error never quotes
// payload content.
func (r *Redactor) Redact(v any, base string) (any, []schemas.Redaction, error) {
	w := walker{r: r, base: base}
	out, err := w.value(v, "", 0, 0)
	if err != nil {
		return nil, nil, err
	}
	findings := w.findings
	if findings == nil {
		findings = []schemas.Redaction{}
	}
	sort.Slice(findings, func(i, j int) bool {
		a, b := findings[i], findings[j]
		if a.Pointer != b.Pointer {
			return a.Pointer < b.Pointer
		}
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return a.Pseudonym < b.Pseudonym
	})
	// Drop exact duplicates (the same secret twice in one string).
	dedup := findings[:0]
	for _, f := range findings {
		if len(dedup) > 0 && f == dedup[len(dedup)-1] {
			continue
		}
		dedup = append(dedup, f)
	}
	return out, dedup, nil
}

// token is one step of the path from the root to the current value.
type token struct {
	key   string
	index int // -1 for an object member
}

// walker carries one Redact call's state: the path (materialized into a
// pointer only when a finding needs it) and the findings.
type walker struct {
	r        *Redactor
	base     string
	path     []token
	findings []schemas.Redaction
}

func (w *walker) push(t token) { w.path = append(w.path, t) }
func (w *walker) pop()         { w.path = w.path[:len(w.path)-1] }

// pointer renders the current path as an RFC 6901 pointer under base.
func (w *walker) pointer() string {
	var sb strings.Builder
	sb.WriteString(w.base)
	for _, t := range w.path {
		sb.WriteByte('/')
		if t.index >= 0 {
			sb.WriteString(strconv.Itoa(t.index))
			continue
		}
		sb.WriteString(strings.ReplaceAll(strings.ReplaceAll(t.key, "~", "~0"), "/", "~1"))
	}
	return sb.String()
}

// hit is one secret's rule and HMAC (hex), before the pointer is known.
type hit struct {
	rule string
	mac  string
}

func marker(h hit) string {
	return "[REDACTED:" + h.rule + ":" + h.mac[:shortHex] + "]"
}

func (w *walker) record(ptr string, hits []hit) {
	for _, h := range hits {
		w.findings = append(w.findings, schemas.Redaction{
			Pointer:   ptr,
			Rule:      h.rule,
			Pseudonym: "hmac-sha256:" + w.r.kid + ":" + h.mac,
		})
	}
}

// value redacts v at the current path. ctx is the member name the value
// sits under ("" at the root), depth the container nesting so far and dec
// the number of decodings already applied.
func (w *walker) value(v any, ctx string, depth, dec int) (any, error) {
	switch t := v.(type) {
	case string:
		s, hits, err := w.str(t, ctx, depth, dec)
		if err != nil {
			return nil, err
		}
		if len(hits) > 0 {
			w.record(w.pointer(), hits)
		}
		return s, nil
	case map[string]any:
		return w.object(t, depth+1, dec)
	case []any:
		return w.array(t, ctx, depth+1, dec)
	case float64, json.Number, bool, nil:
		return t, nil
	default:
		return nil, fmt.Errorf("%w: %T", ErrUnsupportedType, v)
	}
}

func (w *walker) object(m map[string]any, depth, dec int) (any, error) {
	if depth > MaxDepth {
		return nil, ErrTooDeep
	}
	out := make(map[string]any, len(m))
	pairName := w.pairName(m)
	for k, v := range m {
		outKey, keyHits, err := w.key(k, depth)
		if err != nil {
			return nil, err
		}
		w.push(token{key: outKey, index: -1})
		if len(keyHits) > 0 {
			w.record(w.pointer(), keyHits)
		}
		var rv any
		switch {
		case w.r.isSensitive(k):
			rv, err = w.whole(v, depth, RuleFieldName)
		case pairName != "" && isOneOf(k, pairValueKeys):
			rv, err = w.whole(v, depth, RuleFieldName)
		default:
			rv, err = w.value(v, k, depth, dec)
		}
		w.pop()
		if err != nil {
			return nil, err
		}
		out[outKey] = rv
	}
	return out, nil
}

// key scans an object member name for secrets (without decoding: a name
// is not a payload) and returns it redacted.
func (w *walker) key(k string, depth int) (string, []hit, error) {
	if len(k) < minRegexLen {
		return k, nil, nil
	}
	return w.text(k, "", depth, w.r.decodeDepth)
}

// pairName returns the sensitive name of a name/value pair object
// ({"name": "Authorization", "value": ...}), or "".
func (w *walker) pairName(m map[string]any) string {
	if len(m) > 8 {
		return ""
	}
	hasValue := false
	name := ""
	for k, v := range m {
		switch {
		case isOneOf(k, pairValueKeys):
			hasValue = true
		case isOneOf(k, pairNameKeys):
			if s, ok := v.(string); ok && w.r.isSensitive(s) {
				name = s
			}
		}
	}
	if !hasValue {
		return ""
	}
	return name
}

func isOneOf(k string, names []string) bool {
	for _, n := range names {
		if strings.EqualFold(k, n) {
			return true
		}
	}
	return false
}

func (w *walker) array(a []any, ctx string, depth, dec int) (any, error) {
	if depth > MaxDepth {
		return nil, ErrTooDeep
	}
	out := make([]any, len(a))
	inKey := false // inside a PEM private key split over elements
	for i, v := range a {
		w.push(token{index: i})
		s, isStr := v.(string)
		var (
			rv  any
			err error
		)
		switch {
		case isStr && !inKey && strings.Contains(s, "-----") && pemBegin.MatchString(s) && !pemEnd.MatchString(s):
			inKey = true
			rv = w.lineOfKey(s)
		case isStr && inKey:
			if pemEnd.MatchString(s) {
				inKey = false
			}
			rv = w.lineOfKey(s)
		default:
			rv, err = w.value(v, ctx, depth, dec)
		}
		w.pop()
		if err != nil {
			return nil, err
		}
		out[i] = rv
	}
	return out, nil
}

func (w *walker) lineOfKey(s string) string {
	if s == "" {
		return s
	}
	h := hit{rule: RulePrivateKeyLines, mac: w.r.mac(s)}
	w.record(w.pointer(), []hit{h})
	return marker(h)
}

// whole redacts every string and number in v (a value under a sensitive
// name), each as itself.
func (w *walker) whole(v any, depth int, rule string) (any, error) {
	var secret string
	switch t := v.(type) {
	case string:
		if t == "" {
			return t, nil
		}
		secret = t
	case json.Number:
		secret = string(t)
	case float64:
		b, err := json.Marshal(t)
		if err != nil { // NaN or Inf: not produced by encoding/json
			return nil, fmt.Errorf("%w: non-finite number", ErrUnsupportedType)
		}
		secret = string(b)
	case bool, nil:
		return t, nil
	case map[string]any:
		if depth+1 > MaxDepth {
			return nil, ErrTooDeep
		}
		out := make(map[string]any, len(t))
		for k, e := range t {
			outKey, keyHits, err := w.key(k, depth+1)
			if err != nil {
				return nil, err
			}
			w.push(token{key: outKey, index: -1})
			if len(keyHits) > 0 {
				w.record(w.pointer(), keyHits)
			}
			rv, err := w.whole(e, depth+1, rule)
			w.pop()
			if err != nil {
				return nil, err
			}
			out[outKey] = rv
		}
		return out, nil
	case []any:
		if depth+1 > MaxDepth {
			return nil, ErrTooDeep
		}
		out := make([]any, len(t))
		for i, e := range t {
			w.push(token{index: i})
			rv, err := w.whole(e, depth+1, rule)
			w.pop()
			if err != nil {
				return nil, err
			}
			out[i] = rv
		}
		return out, nil
	default:
		return nil, fmt.Errorf("%w: %T", ErrUnsupportedType, v)
	}
	h := hit{rule: rule, mac: w.r.mac(secret)}
	w.record(w.pointer(), []hit{h})
	return marker(h), nil
}
