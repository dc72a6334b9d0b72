package redact

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"regexp"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// pemBegin and pemEnd recognise the first and last line of a PEM private
// key (same shape as gitleaks' private-key rule).
var (
	pemBegin = regexp.MustCompile(`(?i)-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----`)
	pemEnd   = regexp.MustCompile(`(?i)-----END[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----`)
)

// minBase64Run is the shortest base64 run that is decoded and scanned.
const minBase64Run = 16

// str redacts one string value: a JSON document inside it is walked as
// JSON, anything else is scanned as text.
func (w *walker) str(s, ctx string, depth, dec int) (string, []hit, error) {
	if dec < w.r.decodeDepth {
		out, hits, ok, err := w.embeddedJSON(s, depth, dec)
		if err != nil || ok {
			return out, hits, err
		}
	}
	return w.text(s, ctx, depth, dec, true)
}

// embeddedJSON handles a string holding a JSON object or array. ok is false
// when s is not one; then it is scanned as text. With secrets inside, the
// string becomes the redacted document re-encoded; without, it is returned
// unchanged. A document too deep to walk is an error, as it would be
// outside a string.
func (w *walker) embeddedJSON(s string, depth, dec int) (string, []hit, bool, error) {
	t := strings.TrimSpace(s)
	if len(t) < 2 || !((t[0] == '{' && t[len(t)-1] == '}') || (t[0] == '[' && t[len(t)-1] == ']')) {
		return "", nil, false, nil
	}
	d := json.NewDecoder(strings.NewReader(t))
	d.UseNumber()
	var inner any
	if err := d.Decode(&inner); err != nil {
		return "", nil, false, nil
	}
	if _, err := d.Token(); err != io.EOF {
		return "", nil, false, nil
	}
	sub := walker{r: w.r}
	red, err := sub.value(inner, "", depth, dec+1)
	if err != nil {
		return "", nil, false, err
	}
	if len(sub.findings) == 0 {
		return s, nil, true, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(red); err != nil {
		return "", nil, false, err
	}
	hits := make([]hit, 0, len(sub.findings))
	for _, f := range sub.findings {
		hits = append(hits, hit{rule: f.Rule + SuffixJSON, mac: macOf(f.Pseudonym)})
	}
	return strings.TrimSuffix(buf.String(), "\n"), hits, true, nil
}

// macOf extracts the hex HMAC from a pseudonym "hmac-sha256:<kid>:<hex>".
func macOf(pseudonym string) string {
	return pseudonym[strings.LastIndexByte(pseudonym, ':')+1:]
}

// span is a stretch of a string to replace and the secrets it holds.
type span struct {
	start, end int
	generic    bool
	hits       []hit
}

// text scans s with the detection rules (in the context of member name
// ctx), by position (when positional: not for object keys) and, decoding
// allowing, its base64 runs, and replaces what they find.
func (w *walker) text(s, ctx string, depth, dec int, positional bool) (string, []hit, error) {
	var spans []span
	w.scratch = w.scratch[:0]
	if positional {
		w.scratch = w.r.positional(s, w.scratch)
	}
	// The same secret is often found twice (by a rule and by position):
	// its HMAC is computed once.
	var memo [4]struct{ secret, mac string }
	nm := 0
	mac := func(secret string) string {
		for _, m := range memo[:nm] {
			if m.secret == secret {
				return m.mac
			}
		}
		h := w.r.mac(secret)
		if nm < len(memo) {
			memo[nm].secret, memo[nm].mac = secret, h
			nm++
		}
		return h
	}
	for _, f := range w.r.rules.scan(ctx, s, w.scratch) {
		spans = append(spans, span{start: f.start, end: f.end, generic: f.generic,
			hits: []hit{{rule: f.rule, mac: mac(f.secret)}}})
	}
	for _, f := range w.scratch {
		spans = append(spans, span{start: f.start, end: f.end,
			hits: []hit{{rule: f.rule, mac: mac(f.secret)}}})
	}
	if dec < w.r.decodeDepth && len(s) >= minBase64Run {
		var err error
		if spans, err = w.base64Runs(s, ctx, depth, dec, spans); err != nil {
			return "", nil, err
		}
	}
	if len(spans) == 0 {
		return s, nil, nil
	}
	out, hits := replaceSpans(s, spans)
	return out, hits, nil
}

// replaceSpans merges overlapping spans and replaces each merged stretch by
// one marker. A generic-rule span lying inside a specific rule's span adds
// no finding of its own (gitleaks reports the specific rule only).
func replaceSpans(s string, spans []span) (string, []hit) {
	// Stable: spans of equal extent keep rule order (gitleaks' rules first,
	// in file order, then Talos's gap fillers, then decoded base64 runs).
	sort.SliceStable(spans, func(i, j int) bool {
		if spans[i].start != spans[j].start {
			return spans[i].start < spans[j].start
		}
		return spans[i].end > spans[j].end
	})
	var sb strings.Builder
	var all []hit
	last := 0
	for i := 0; i < len(spans); {
		start, end := spans[i].start, spans[i].end
		j := i + 1
		for j < len(spans) && spans[j].start < end {
			if spans[j].end > end {
				end = spans[j].end
			}
			j++
		}
		cluster := spans[i:j]
		var hits []hit
		for _, sp := range cluster { // specific rules first
			if !sp.generic {
				hits = append(hits, sp.hits...)
			}
		}
		for _, sp := range cluster {
			if sp.generic && !coveredBySpecific(sp, cluster) {
				hits = append(hits, sp.hits...)
			}
		}
		hits = dedupeByMAC(hits)
		sb.WriteString(s[last:start])
		sb.WriteString(marker(hits[0]))
		all = append(all, hits...)
		last = end
		i = j
	}
	sb.WriteString(s[last:])
	return sb.String(), all
}

// dedupeByMAC keeps the first rule that found each distinct secret
// (authorization-header and bearer-token both see "Authorization: Bearer x").
func dedupeByMAC(hits []hit) []hit {
	out := hits[:0]
	for _, h := range hits {
		dup := false
		for _, o := range out {
			if o.mac == h.mac {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, h)
		}
	}
	return out
}

func coveredBySpecific(g span, cluster []span) bool {
	for _, sp := range cluster {
		if !sp.generic && sp.start <= g.start && g.end <= sp.end {
			return true
		}
	}
	return false
}

// base64Runs decodes every run of base64 characters of at least
// minBase64Run in s whose decoding is printable text, redacts that text,
// and adds a span for each run with secrets inside.
func (w *walker) base64Runs(s, ctx string, depth, dec int, spans []span) ([]span, error) {
	for i := 0; i < len(s); {
		if !isB64(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && isB64(s[j]) {
			j++
		}
		end := j
		for end < len(s) && end-j < 2 && s[end] == '=' {
			end++
		}
		if j-i >= minBase64Run {
			if txt, ok := decodeBase64(s[i:end]); ok {
				_, hits, err := w.str(txt, ctx, depth, dec+1)
				if err != nil {
					return nil, err
				}
				if len(hits) > 0 {
					for k := range hits {
						hits[k].rule += SuffixBase64
					}
					spans = append(spans, span{start: i, end: end, hits: hits})
				}
			}
		}
		i = end
	}
	return spans, nil
}

func isB64(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
		c == '+' || c == '/' || c == '-' || c == '_'
}

// decodeBase64 decodes standard or URL-safe base64, padded or not, and
// accepts the result only if it is printable UTF-8 text.
func decodeBase64(run string) (string, bool) {
	std := strings.ContainsAny(run, "+/")
	url := strings.ContainsAny(run, "-_")
	if std && url {
		return "", false
	}
	body := strings.TrimRight(run, "=")
	if len(body)%4 == 1 {
		return "", false
	}
	enc := base64.RawStdEncoding
	if url {
		enc = base64.RawURLEncoding
	}
	// Most runs are not encoded text (hashes, ids, keys): their first
	// bytes already show it.
	var head [6]byte
	if n, err := enc.Decode(head[:], []byte(body[:min(8, len(body)/4*4)])); err != nil || !printablePrefix(head[:n]) {
		return "", false
	}
	b, err := enc.DecodeString(body)
	if err != nil || !printable(b) {
		return "", false
	}
	return string(b), true
}

// printablePrefix reports whether b can begin printable text: printable
// runs up to a last rune that may be cut short.
func printablePrefix(b []byte) bool {
	for len(b) > 0 {
		c := b[0]
		if c < utf8.RuneSelf {
			if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f {
				return false
			}
			b = b[1:]
			continue
		}
		if !utf8.FullRune(b) {
			return utf8.RuneStart(c) && c >= 0xC2 && c <= 0xF4
		}
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
		b = b[n:]
	}
	return true
}

// printable reports whether b is UTF-8 text of printable characters, tabs
// and line breaks.
func printable(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for len(b) > 0 {
		c := b[0]
		if c < utf8.RuneSelf {
			if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f {
				return false
			}
			b = b[1:]
			continue
		}
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
		b = b[n:]
	}
	return true
}
