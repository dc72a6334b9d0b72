package redact

import (
	"regexp"
	"regexp/syntax"
	"sort"
	"strings"
)

// Many rules are keyword-led: every match begins with one of the rule's
// keywords (jwt with "ey", vault-service-token with "s.", private-key with
// "-----begin"). Go's regexp has no DFA and no literal skip for patterns
// that open with \b or (?i), so searching a long text costs far more than
// the text is likely to deserve; for those rules Talos instead runs the
// pattern anchored at each keyword occurrence. Every match starts at a
// keyword occurrence, and Go's leftmost-first choice at a given start does
// not depend on the search, so trying occurrences in order and skipping
// those inside the previous match yields exactly FindAll's matches. A
// leading \b is checked against the real preceding byte (an anchored run
// would see the start of input there).

// anchoring is how a keyword-led rule is run.
type anchoring struct {
	re       *regexp.Regexp // ^(?:pattern)
	boundary bool           // the pattern opens with \b
}

// anchorFor returns the anchoring of a pattern whose every match begins
// with one of keywords (compared ASCII-case-insensitively), or nil.
func anchorFor(re *regexp.Regexp, keywords []string) *anchoring {
	if len(keywords) == 0 {
		return nil
	}
	parsed, err := syntax.Parse(re.String(), syntax.Perl)
	if err != nil {
		return nil
	}
	lits, flags, ok := leading(parsed.Simplify())
	if !ok || flags&^syntax.EmptyWordBoundary != 0 {
		return nil
	}
	for _, lit := range lits {
		led := false
		for _, k := range keywords {
			if strings.HasPrefix(strings.ToLower(lit), strings.ToLower(k)) {
				led = true
				break
			}
		}
		if !led {
			return nil
		}
	}
	a, err := regexp.Compile(`^(?:` + re.String() + `)`)
	if err != nil || a.NumSubexp() != re.NumSubexp() {
		return nil
	}
	return &anchoring{re: a, boundary: flags&syntax.EmptyWordBoundary != 0}
}

// leading returns the literals every match of re starts with (one per
// alternative) and the zero-width assertions before them. ok is false
// when some match may start otherwise.
func leading(re *syntax.Regexp) (lits []string, flags syntax.EmptyOp, ok bool) {
	switch re.Op {
	case syntax.OpLiteral:
		if len(re.Rune) == 0 {
			return nil, 0, false
		}
		for _, r := range re.Rune {
			if r >= 0x80 {
				return nil, 0, false
			}
		}
		return []string{string(re.Rune)}, 0, true
	case syntax.OpCapture:
		return leading(re.Sub[0])
	case syntax.OpConcat:
		for i, sub := range re.Sub {
			if sub.Op == syntax.OpEmptyMatch {
				continue
			}
			if sub.Op == syntax.OpWordBoundary {
				flags |= syntax.EmptyWordBoundary
				continue
			}
			if sub.Op == syntax.OpBeginLine || sub.Op == syntax.OpBeginText ||
				sub.Op == syntax.OpNoWordBoundary || sub.Op == syntax.OpEndLine || sub.Op == syntax.OpEndText {
				return nil, 0, false
			}
			l, f, ok := leading(re.Sub[i])
			return l, flags | f, ok
		}
		return nil, 0, false
	case syntax.OpAlternate:
		for _, sub := range re.Sub {
			l, f, ok := leading(sub)
			if !ok {
				return nil, 0, false
			}
			lits = append(lits, l...)
			flags |= f
		}
		return lits, flags, true
	}
	return nil, 0, false
}

// findAnchored appends the findings of a keyword-led rule, trying the
// pattern at each keyword occurrence in kws.
func (r *scanRule) findAnchored(text string, kws []kwHit, lo, hi int, hits []ruleHit) []ruleHit {
	if len(kws) > 1 {
		sort.Slice(kws, func(i, j int) bool { return kws[i].start < kws[j].start })
	}
	next := 0 // matches do not overlap: the next starts at or after this
	last := -1
	for _, kw := range kws {
		p := int(kw.start)
		if p < next || p == last {
			continue
		}
		last = p
		if r.anchor.boundary && p > 0 && isWordByte(text[p-1]) == isWordByte(text[p]) {
			continue
		}
		m := r.anchor.re.FindStringSubmatchIndex(text[p:])
		if m == nil {
			continue
		}
		for k := range m {
			if m[k] >= 0 {
				m[k] += p
			}
		}
		hits = r.consider(text, m, lo, hi, hits)
		next = m[1]
	}
	return hits
}

func isWordByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
}
