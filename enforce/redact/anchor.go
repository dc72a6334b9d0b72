package redact

import (
	"regexp"
	"regexp/syntax"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Go's regexp has no DFA and skips ahead only for patterns opening with a
// plain literal, so a gitleaks pattern costs roughly a microsecond per byte
// of text it searches. Most patterns, however, contain a keyword-led part:
// a point in the pattern where every match continues with one of the rule's
// keywords (jwt's "ey", lob-api-key's "test_" inside its secret). The
// keyword automaton already knows where those keywords occur, so a rule can
// be run only where a match could be:
//
//   - anchored, when nothing but \b precedes the keyword-led part: the
//     pattern, anchored, is tried at each keyword occurrence in order,
//     skipping those inside the previous match. Every match starts at an
//     occurrence and Go's leftmost-first choice at a given start does not
//     depend on where the search began, so this yields exactly FindAll's
//     matches. A leading \b is checked against the real preceding byte.
//   - windowed, when the pattern has a finite maximum width: a match
//     starts at most `before` bytes ahead of its keyword and ends at most
//     `after` bytes past the keyword's start, so FindAll runs on those
//     stretches (one byte wider on each side, merged when they overlap).
//     No match can start or end on a widened edge (its keyword would lie
//     outside the stretch), so assertions such as \b and $ only ever see
//     real neighbours, and the matches are again exactly FindAll's.
//
// Other rules search the whole text. TestStrategiesEquivalent checks both
// strategies against plain FindAll on every rule.
//
// Keyword occurrences are found case-insensitively as (?i) would match them
// (see keywordIndex.walk), so a keyword-led part written in any case is
// found.

// strategy says how to run one rule.
type strategy struct {
	anchored *regexp.Regexp // ^(?:pattern), for the anchored strategy
	boundary bool           // the anchored pattern opens with \b
	before   int            // windowed: bytes a match may start before its keyword
	after    int            // windowed: bytes a match may end after its keyword's start
}

// maxPrefixes bounds the literal prefix sets the analysis builds.
const maxPrefixes = 64

// strategyFor analyses a rule's pattern; nil means search whole texts.
func strategyFor(re *regexp.Regexp, keywords []string) *strategy {
	if len(keywords) == 0 {
		return nil
	}
	parsed, err := syntax.Parse(re.String(), syntax.Perl)
	if err != nil {
		return nil
	}
	elems := flatten(parsed.Simplify(), nil)
	before := 0 // width of elems[:i]; -1 once unbounded
	for i := range elems {
		if set, ok := prefixSeq(elems[i:]); ok && keywordLed(set, keywords) {
			if before == 0 {
				return anchored(re, elems[:i])
			}
			after := width(elems[i:])
			if before < 0 || after < 0 {
				return nil
			}
			return &strategy{before: before, after: after}
		}
		if w := width(elems[i : i+1]); w < 0 || before < 0 {
			before = -1
		} else {
			before += w
		}
	}
	return nil
}

// anchored builds the anchored strategy; lead are the zero-width
// elements before the keyword-led part (only \b is supported).
func anchored(re *regexp.Regexp, lead []*syntax.Regexp) *strategy {
	s := &strategy{}
	for _, e := range lead {
		switch e.Op {
		case syntax.OpWordBoundary:
			s.boundary = true
		case syntax.OpEmptyMatch:
		default:
			return nil
		}
	}
	a, err := regexp.Compile(`^(?:` + re.String() + `)`)
	if err != nil || a.NumSubexp() != re.NumSubexp() {
		return nil
	}
	s.anchored = a
	return s
}

// flatten lists the top-level sequence of re, looking through captures and
// nested concatenations.
func flatten(re *syntax.Regexp, out []*syntax.Regexp) []*syntax.Regexp {
	switch re.Op {
	case syntax.OpConcat:
		for _, sub := range re.Sub {
			out = flatten(sub, out)
		}
		return out
	case syntax.OpCapture:
		if re.Sub[0].Op == syntax.OpConcat {
			return flatten(re.Sub[0], out)
		}
	}
	return append(out, re)
}

// keywordLed reports whether every prefix begins with some keyword.
func keywordLed(set []string, keywords []string) bool {
	for _, p := range set {
		p = strings.ToLower(p)
		led := false
		for _, k := range keywords {
			if k != "" && strings.HasPrefix(p, strings.ToLower(k)) {
				led = true
				break
			}
		}
		if !led {
			return false
		}
	}
	return len(set) > 0
}

// prefixSeq returns literal strings every match of the sequence begins
// with. ok is false when some match may begin with no literal.
func prefixSeq(seq []*syntax.Regexp) ([]string, bool) {
	cur := []string{""}
	for _, e := range seq {
		set, exact, ok := prefixes(e)
		if !ok {
			break
		}
		next := make([]string, 0, len(cur)*len(set))
		for _, c := range cur {
			for _, s := range set {
				next = append(next, c+s)
			}
		}
		if len(next) > maxPrefixes {
			break
		}
		cur = next
		if !exact {
			break
		}
	}
	if len(cur) == 1 && cur[0] == "" {
		return nil, false
	}
	return cur, true
}

// prefixes returns the ASCII literals every match of re begins with;
// exact means re matches exactly those strings.
func prefixes(re *syntax.Regexp) (set []string, exact, ok bool) {
	switch re.Op {
	case syntax.OpLiteral:
		if len(re.Rune) == 0 {
			return nil, false, false
		}
		for _, r := range re.Rune {
			// (?i) ASCII letters fold only onto ASCII, U+017F and U+212A,
			// all of which the keyword automaton folds too.
			if r >= utf8.RuneSelf {
				return nil, false, false
			}
		}
		return []string{string(re.Rune)}, true, true
	case syntax.OpCharClass:
		n := 0
		for i := 0; i < len(re.Rune); i += 2 {
			if re.Rune[i+1] >= utf8.RuneSelf {
				return nil, false, false
			}
			n += int(re.Rune[i+1]-re.Rune[i]) + 1
		}
		if n == 0 || n > 8 {
			return nil, false, false
		}
		for i := 0; i < len(re.Rune); i += 2 {
			for r := re.Rune[i]; r <= re.Rune[i+1]; r++ {
				set = append(set, string(r))
			}
		}
		return set, true, true
	case syntax.OpCapture:
		return prefixes(re.Sub[0])
	case syntax.OpConcat:
		set, ok := prefixSeq(flatten(re, nil))
		return set, false, ok
	case syntax.OpAlternate:
		exact = true
		for _, sub := range re.Sub {
			s, e, ok := prefixes(sub)
			if !ok {
				return nil, false, false
			}
			set = append(set, s...)
			exact = exact && e
		}
		return set, exact, len(set) <= maxPrefixes
	case syntax.OpPlus:
		set, _, ok = prefixes(re.Sub[0])
		return set, false, ok
	case syntax.OpRepeat:
		if re.Min < 1 {
			return nil, false, false
		}
		set, exact, ok = prefixes(re.Sub[0])
		return set, exact && re.Min == 1 && re.Max == 1, ok
	}
	return nil, false, false
}

// width returns the most bytes a match of the sequence can span, or -1 if
// unbounded.
func width(seq []*syntax.Regexp) int {
	total := 0
	for _, e := range seq {
		w := width1(e)
		if w < 0 {
			return -1
		}
		total += w
	}
	return total
}

func width1(re *syntax.Regexp) int {
	switch re.Op {
	case syntax.OpEmptyMatch, syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText,
		syntax.OpEndText, syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return 0
	case syntax.OpLiteral:
		n := 0
		for _, r := range re.Rune {
			m := utf8.RuneLen(r)
			if re.Flags&syntax.FoldCase != 0 {
				for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
					m = max(m, utf8.RuneLen(f))
				}
			}
			n += m
		}
		return n
	case syntax.OpCharClass:
		if len(re.Rune) == 0 {
			return 0
		}
		return max(utf8.RuneLen(re.Rune[len(re.Rune)-1]), 1)
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return utf8.UTFMax
	case syntax.OpCapture:
		return width1(re.Sub[0])
	case syntax.OpConcat:
		return width(re.Sub)
	case syntax.OpAlternate:
		w := 0
		for _, sub := range re.Sub {
			s := width1(sub)
			if s < 0 {
				return -1
			}
			w = max(w, s)
		}
		return w
	case syntax.OpQuest:
		return width1(re.Sub[0])
	case syntax.OpRepeat:
		if re.Max < 0 {
			return -1
		}
		s := width1(re.Sub[0])
		if s < 0 {
			return -1
		}
		return s * re.Max
	}
	return -1 // star, plus and anything unforeseen
}

// matchAnchored tries the anchored pattern at each keyword occurrence in
// kws, in order, skipping those inside the previous match.
func (r *scanRule) matchAnchored(text string, kws []kwHit) [][]int {
	if len(kws) > 1 {
		sort.Slice(kws, func(i, j int) bool { return kws[i].start < kws[j].start })
	}
	var out [][]int
	next := 0 // matches do not overlap: the next starts at or after this
	last := -1
	for _, kw := range kws {
		p := int(kw.start)
		if p < next || p == last {
			continue
		}
		last = p
		if r.strategy.boundary && p > 0 && isWordByte(text[p-1]) == isWordByte(text[p]) {
			continue
		}
		m := r.strategy.anchored.FindStringSubmatchIndex(text[p:])
		if m == nil {
			continue
		}
		for k := range m {
			if m[k] >= 0 {
				m[k] += p
			}
		}
		out = append(out, m)
		next = m[1]
	}
	return out
}

// windows returns the merged stretches of text the windowed strategy
// searches.
func (s *strategy) windows(text string, kws []kwHit, dst [][2]int) [][2]int {
	for _, kw := range kws {
		start := max(int(kw.start)-s.before-1, 0)
		end := min(int(kw.start)+s.after+1, len(text))
		dst = append(dst, [2]int{start, end})
	}
	return mergeWindows(dst)
}

// mergeWindows sorts windows and merges those that overlap or touch.
func mergeWindows(dst [][2]int) [][2]int {
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

func isWordByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
}
