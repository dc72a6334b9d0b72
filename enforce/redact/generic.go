package redact

import "sort"

// genericSource is gitleaks' generic-api-key pattern as of v8.30.1. Its
// keywords (access, api, auth, key, password, secret, token, ...) occur in
// ordinary prose and its counted repetitions make Go's regexp cost about a
// microsecond per byte scanned, so scanning every string that mentions a
// "key" would dominate the worker's budget. genericWindows confines the
// regex to the few places a match is possible; it is attached only while
// the rule's pattern is exactly this one (TestGenericWindowsActive fails
// after a gitleaks upgrade that changes it; the rule then still runs, on
// whole texts).
const genericSource = `(?i)[\w.-]{0,50}?(?:access|auth|(?-i:[Aa]pi|API)|credential|creds|key|passw(?:or)?d|secret|token)(?:[ \t\w.-]{0,20})[\s'"]{0,3}(?:=|>|:{1,3}=|\|\||:|=>|\?=|,)[\x60'"\s=]{0,5}([\w.=-]{10,150}|[a-z0-9][a-z0-9+/]{11,}={0,3})(?:[\x60'"\s;]|\\[nr]|$)`

// Character classes of genericSource, as byte tables.
var (
	// genGap: what may separate the keyword from the operator,
	// [ \t\w.-]{0,20} then [\s'"]{0,3}.
	genGap = byteSet(" \t\n\f\r.-'\"" + wordChars)
	// genOpStart: the first byte of an operator (= > :{1,3}= || : => ?= ,).
	genOpStart = byteSet("=>:|?,")
	// genAfterOp: the rest of an operator, then [\x60'"\s=]{0,5}.
	genAfterOp = byteSet("=:|>`'\" \t\n\f\r")
	// genSecret: both secret alternatives, [\w.=-] and [a-z0-9+/] (case
	// folded), with '=' padding.
	genSecret = byteSet(".=-+/" + wordChars)
)

const wordChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"

const (
	genMaxPrefix = 50     // [\w.-]{0,50}? before the keyword
	genMaxGap    = 20 + 3 // between keyword and operator
	genMaxSkip   = 3 + 5  // operator tail, then quotes, spaces, '='
	genMinSecret = 10     // shortest secret of either alternative
	genMaxTerm   = 2      // terminator: one byte, or \n / \r escaped
)

func byteSet(chars string) (set [256]bool) {
	for i := 0; i < len(chars); i++ {
		set[chars[i]] = true
	}
	return set
}

// genericWindows returns the stretches of text in which genericSource can
// match, given where its keywords occur. It checks what every match needs
// after its keyword: a gap of at most 23 gap bytes, an operator, at most 8
// more operator/quote/space bytes, and at least 10 secret bytes. A window
// runs from 50 bytes before the keyword to 2 bytes past the longest run of
// secret bytes, so it holds any match that uses that keyword; overlapping
// windows are merged, so each match lies in exactly one. The regex run on a
// window finds what it would find on the whole text (a match cannot end at
// a window's inner edge: the byte before that edge's terminator allowance
// is not a secret byte). TestGenericWindowsEquivalent checks this against
// the plain regex.
func genericWindows(text string, kws []kwHit, dst [][2]int) [][2]int {
	for _, kw := range kws {
		e := int(kw.end)
		op := -1
		for k := 0; k <= genMaxGap && e+k < len(text); k++ {
			c := text[e+k]
			if genOpStart[c] {
				op = e + k
				break
			}
			if !genGap[c] {
				break
			}
		}
		if op < 0 {
			continue
		}
		end := -1
		for i := op + 1; i <= op+1+genMaxSkip && i < len(text); i++ {
			j := i
			for j < len(text) && genSecret[text[j]] {
				j++
			}
			if j-i >= genMinSecret && j > end {
				end = j
			}
			if !genAfterOp[text[i]] {
				break
			}
		}
		if end < 0 {
			continue
		}
		start := max(int(kw.start)-genMaxPrefix, 0)
		dst = append(dst, [2]int{start, min(end+genMaxTerm, len(text))})
	}
	if len(dst) < 2 {
		return dst
	}
	sort.Slice(dst, func(i, j int) bool { return dst[i][0] < dst[j][0] })
	merged := dst[:1]
	for _, w := range dst[1:] {
		last := &merged[len(merged)-1]
		if w[0] <= last[1] {
			last[1] = max(last[1], w[1])
			continue
		}
		merged = append(merged, w)
	}
	return merged
}
