package redact

import (
	"math"
	"math/bits"
	"strings"
	"unicode/utf8"
)

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

// Character classes of genericSource, as ASCII byte tables (see genChar).
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
	genMaxPrefix = 50     // [\w.-]{0,50}? characters before the keyword
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

// genericWindowsFor returns the window function of generic-api-key with
// the given entropy threshold and allowlisted "<qualifier>[_.-]key"
// qualifiers.
func genericWindowsFor(entropy float64, qualifiers []string) func(string, []kwHit, [][2]int) [][2]int {
	// A secret with entropy above e has more than 2^e distinct characters
	// (Shannon entropy is at most log2 of the alphabet used).
	minDistinct := 0
	if entropy > 0 {
		minDistinct = int(math.Floor(math.Exp2(entropy))) + 1
	}
	return func(text string, kws []kwHit, dst [][2]int) [][2]int {
		return genericWindows(text, kws, minDistinct, qualifiers, dst)
	}
}

// qualifiedKey reports whether the keyword at [start, end) is "key" right
// after one of qualifiers (and an optional '_', '.' or '-'), all within the
// 50 characters a match may reach back: a match through that keyword
// contains "<qualifier>key" and is allowlisted.
func qualifiedKey(text string, start, end int, qualifiers []string) bool {
	if end-start != 3 || !strings.EqualFold(text[start:end], "key") {
		return false
	}
	p := start
	if p > 0 && (text[p-1] == '_' || text[p-1] == '.' || text[p-1] == '-') {
		p--
	}
	for _, q := range qualifiers {
		if p >= len(q) && start-(p-len(q)) <= genMaxPrefix && strings.EqualFold(text[p-len(q):p], q) {
			return true
		}
	}
	return false
}

// genericWindows returns the stretches of text in which genericSource can
// match, given where its keywords occur. It checks what every match needs
// after its keyword: a gap of at most 23 gap characters, an operator, at
// most 8 more operator/quote/space bytes, then at least 10 secret
// characters with at least minDistinct distinct ones (the entropy
// threshold; checked for ASCII runs only). A window runs from 50
// characters before the keyword to 2 bytes past the longest run of secret
// characters, so it holds any match that uses that keyword; overlapping
// windows are merged, so each match lies in exactly one. The regex run on a
// window finds what it would find on the whole text: a match cannot end at
// a window's inner edge, because the byte after its run of secret
// characters is not one. Keywords in allowlisted "<qualifier>_key" names
// open no window (see qualifiedKey). TestStrategiesEquivalent and
// TestGenericWindowsBoundaries check all this against the plain regex.
func genericWindows(text string, kws []kwHit, minDistinct int, qualifiers []string, dst [][2]int) [][2]int {
	for _, kw := range kws {
		if qualifiedKey(text, int(kw.start), int(kw.end), qualifiers) {
			continue
		}
		op := -1
		for i, k := int(kw.end), 0; i < len(text) && k <= genMaxGap; k++ {
			if genOpStart[text[i]] {
				op = i
				break
			}
			n := genChar(text, i, &genGap)
			if n == 0 {
				break
			}
			i += n
		}
		if op < 0 {
			continue
		}
		end := -1
		for i := op + 1; i <= op+1+genMaxSkip && i < len(text); i++ {
			j, chars, ascii := i, 0, true
			var seen [2]uint64
			for j < len(text) {
				n := genChar(text, j, &genSecret)
				if n == 0 {
					break
				}
				if n == 1 {
					seen[text[j]>>6] |= 1 << (text[j] & 63)
				} else {
					ascii = false
				}
				j += n
				chars++
			}
			distinct := bits.OnesCount64(seen[0]) + bits.OnesCount64(seen[1])
			if chars >= genMinSecret && (!ascii || distinct >= minDistinct) && j > end {
				end = j
			}
			if !genAfterOp[text[i]] {
				break
			}
		}
		if end < 0 {
			continue
		}
		// Up to 50 prefix characters of at most 3 bytes each.
		start := max(int(kw.start)-3*genMaxPrefix, 0)
		dst = append(dst, [2]int{start, min(end+genMaxTerm, len(text))})
	}
	return mergeWindows(dst)
}

// genChar returns the byte length of the character at text[i] if it is in
// class, or 0. A class holding letters also holds U+017F and U+212A, which
// (?i) folds onto s and k.
func genChar(text string, i int, class *[256]bool) int {
	c := text[i]
	if c < utf8.RuneSelf {
		if class[c] {
			return 1
		}
		return 0
	}
	if !class['s'] {
		return 0
	}
	if c == 0xC5 && i+1 < len(text) && text[i+1] == 0xBF {
		return 2
	}
	if c == 0xE2 && i+2 < len(text) && text[i+1] == 0x84 && text[i+2] == 0xAA {
		return 3
	}
	return 0
}
