package redact

import (
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
	"github.com/talos-audit/talos/schemas/jsonkit"
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
	// FieldNames replaces DefaultFieldNames when non-nil: the secret
	// names, exact or with '*' standing for any run of characters and '?'
	// for one ("*pass*", "*_otp"), compared after normalization (see
	// names.go).
	// They decide JSON members, KEY=value and key: value pairs in text,
	// command-line flags, connection-string keywords, URL query
	// parameters and header lines alike.
	FieldNames []string
	// ExtraFieldNames are added to the field names in use.
	ExtraFieldNames []string
	// NotSecretWords replaces DefaultNotSecretWords when non-nil: words
	// removed from a name before the patterns are tried ("keyboard",
	// "max_tokens" are then no secret names).
	NotSecretWords []string
	// NameQualifiers replaces DefaultNameQualifiers when non-nil: last
	// words that make a pattern-matched name describe a secret instead of
	// holding one ("password_file", "token_url").
	NameQualifiers []string
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
	names       *names
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
	secret := cfg.FieldNames
	if secret == nil {
		secret = DefaultFieldNames
	}
	notSecret := cfg.NotSecretWords
	if notSecret == nil {
		notSecret = DefaultNotSecretWords
	}
	qualifiers := cfg.NameQualifiers
	if qualifiers == nil {
		qualifiers = DefaultNameQualifiers
	}
	nm, err := newNames(append(append([]string(nil), secret...), cfg.ExtraFieldNames...), notSecret, qualifiers)
	if err != nil {
		return nil, err
	}
	r := &Redactor{
		key:         append([]byte(nil), cfg.Key...),
		kid:         kid,
		names:       nm,
		decodeDepth: depth,
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

// isSensitive reports whether a member name is a secret name.
func (r *Redactor) isSensitive(name string) bool { return r.names.secret(name) }

// Redact returns a deep copy of v (a JSON tree as encoding/json decodes it,
// with or without UseNumber: map[string]any, []any, string, float64,
// json.Number, bool, nil) in which every secret found is replaced by
// "[REDACTED:<rule>:<12 hex>]", and the findings sorted by pointer, rule and
// pseudonym. base prefixes every pointer (e.g. "/args"). v is never
// modified.
//
// What is replaced:
//   - in a string, the secret part a rule identifies (the password of
//     https://u:pw@host, the token after "Bearer ") and every value that
//     sits where a secret sits (after a secret-named flag, KEY= or key:,
//     in a connection string's password pair; rules "secret-flag",
//     "secret-assignment", "url-userinfo-password"); overlapping findings
//     merge into one replacement;
//   - a string or number under a sensitive member name, whole; every string
//     and number inside an object or array under such a name;
//   - in an argument array, the element after a secret-named flag, or the
//     part of an element after its flag (-pSECRET, --token=SECRET);
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
	// argvHint is the command named by a sibling of the array being
	// walked ({"command": "mysql", "args": [...]}).
	argvHint string
	// scratch holds one string's positional findings.
	scratch []found
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
		sb.WriteString(jsonkit.EscapeToken(t.key))
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
		if len(hits) == 0 {
			return v, nil // unchanged: no new interface value
		}
		w.record(w.pointer(), hits)
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
			if _, isArray := v.([]any); isArray {
				w.argvHint = commandHint(m)
			}
			rv, err = w.value(v, k, depth, dec)
			w.argvHint = ""
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
	return w.text(k, "", depth, w.r.decodeDepth, false)
}

// pairName returns the sensitive name of a name/value pair object
// ({"name": "Authorization", "value": ...}), or "".
func (w *walker) pairName(m map[string]any) string {
	if len(m) > 8 {
		return ""
	}
	hasValue := false
	for k := range m {
		if len(k) == 5 && isOneOf(k, pairValueKeys) {
			hasValue = true
			break
		}
	}
	if !hasValue {
		return ""
	}
	for k, v := range m {
		if len(k) <= 6 && isOneOf(k, pairNameKeys) {
			if s, ok := v.(string); ok && w.r.isSensitive(s) {
				return s
			}
		}
	}
	return ""
}

// commandHintKeys name the member of a tool's arguments that holds the
// program an argument array is passed to.
var commandHintKeys = []string{"command", "cmd", "program", "executable", "binary", "bin", "exe", "tool"}

// commandHint returns the program named by m, if any.
func commandHint(m map[string]any) string {
	for _, k := range commandHintKeys {
		if s, ok := m[k].(string); ok {
			return s
		}
	}
	return ""
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
	argv := w.argvValues(a)
	for i, v := range a {
		w.push(token{index: i})
		s, isStr := v.(string)
		var (
			rv  any
			err error
		)
		skip, isArg := argv[i]
		switch {
		case isStr && !inKey && strings.Contains(s, "-----") && pemBegin.MatchString(s) && !pemEnd.MatchString(s):
			inKey = true
			rv = w.lineOfKey(s)
		case isStr && inKey:
			if pemEnd.MatchString(s) {
				inKey = false
			}
			rv = w.lineOfKey(s)
		case isArg && skip == 0:
			rv, err = w.whole(v, depth, RuleSecretFlag)
		case isArg && isStr:
			rv, err = w.flagTail(s, skip, ctx, depth, dec)
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

// argvValues finds the elements of an argument array (["mysql",
// "-psecret"], ["--password", "x"]) that hold flag values: element index
// to the bytes of its string to keep (0: the whole element is the value).
// The command may be the array's first element or the string of a
// sibling member named like "command" (w.argvHint).
func (w *walker) argvValues(a []any) map[int]int {
	if len(a) < 2 && w.argvHint == "" {
		return nil
	}
	flagLike := false
	for _, v := range a {
		if s, ok := v.(string); ok && len(s) > 1 && s[0] == '-' {
			flagLike = true
			break
		}
	}
	if !flagLike {
		return nil
	}
	lits := make([]string, len(a))
	for i, v := range a {
		switch t := v.(type) {
		case string:
			lits[i] = t
		case json.Number:
			lits[i] = string(t)
		}
	}
	vals := w.r.flagValues(lits, w.argvHint, false, nil)
	if len(vals) == 0 {
		return nil
	}
	out := make(map[int]int, len(vals))
	for _, fv := range vals {
		if fv.skip < len(lits[fv.word]) || fv.skip == 0 {
			out[fv.word] = fv.skip
		}
	}
	return out
}

// flagTail redacts s[skip:], the value attached to a flag (-pSECRET,
// --token=SECRET). The element may also be shell text rather than one
// argument (--token='x'): what the text scan finds there is recorded too.
func (w *walker) flagTail(s string, skip int, ctx string, depth, dec int) (any, error) {
	_, hits, err := w.str(s, ctx, depth, dec)
	if err != nil {
		return nil, err
	}
	secret := s[skip:]
	if placeholder(secret) && len(hits) == 0 {
		return s, nil
	}
	h := hit{rule: RuleSecretFlag, mac: w.r.mac(secret)}
	hits = dedupeByMAC(append([]hit{h}, hits...))
	w.record(w.pointer(), hits)
	return s[:skip] + marker(h), nil
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
