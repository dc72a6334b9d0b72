package redact

import (
	"math/rand"
	"reflect"
	"regexp/syntax"
	"strings"
	"testing"
	"unicode/utf8"
)

// genMatch writes a random string of the language of re (zero-width
// assertions are ignored, so some strings do not match; that is fine for
// a differential test).
func genMatch(rng *rand.Rand, re *syntax.Regexp, sb *strings.Builder) {
	switch re.Op {
	case syntax.OpLiteral:
		for _, r := range re.Rune {
			if re.Flags&syntax.FoldCase != 0 && rng.Intn(2) == 0 {
				switch {
				case r == 's' && rng.Intn(8) == 0:
					r = '\u017f' // LATIN SMALL LETTER LONG S
				case r == 'k' && rng.Intn(8) == 0:
					r = '\u212a' // KELVIN SIGN
				case 'a' <= r && r <= 'z':
					r -= 'a' - 'A'
				case 'A' <= r && r <= 'Z':
					r += 'a' - 'A'
				}
			}
			sb.WriteRune(r)
		}
	case syntax.OpCharClass:
		if len(re.Rune) == 0 {
			return
		}
		// Prefer ASCII ranges.
		for try := 0; try < 8; try++ {
			i := 2 * rng.Intn(len(re.Rune)/2)
			lo, hi := re.Rune[i], re.Rune[i+1]
			if hi >= utf8.RuneSelf && try < 7 {
				continue
			}
			if hi-lo > 1000 {
				hi = lo + 1000
			}
			sb.WriteRune(lo + rune(rng.Intn(int(hi-lo)+1)))
			return
		}
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		sb.WriteByte(byte('!' + rng.Intn(90)))
	case syntax.OpCapture:
		genMatch(rng, re.Sub[0], sb)
	case syntax.OpConcat:
		for _, sub := range re.Sub {
			genMatch(rng, sub, sb)
		}
	case syntax.OpAlternate:
		genMatch(rng, re.Sub[rng.Intn(len(re.Sub))], sb)
	case syntax.OpQuest:
		if rng.Intn(2) == 0 {
			genMatch(rng, re.Sub[0], sb)
		}
	case syntax.OpStar, syntax.OpPlus, syntax.OpRepeat:
		lo, hi := 0, 6
		switch re.Op {
		case syntax.OpPlus:
			lo = 1
		case syntax.OpRepeat:
			lo, hi = re.Min, re.Max
			if hi < 0 || hi > lo+40 {
				hi = lo + 40
			}
		}
		n := lo + rng.Intn(hi-lo+1)
		for i := 0; i < n; i++ {
			genMatch(rng, re.Sub[0], sb)
		}
	}
}

var fillers = []string{
	" ", "\n", "\t", `"`, "'", "=", ": ", ", ", ";", "`", `\n`, "x", "_", "-", ".", "/", "key=", "token: ",
	"the api key is", "password", "Bearer ", "s.", "ey", "https://", "@", "{", "}", "\u017f", "\u212a", "é",
	"0123456789abcdef", "AKIA", "sk_live_", "-----BEGIN RSA PRIVATE KEY-----",
}

// corpus builds texts around random matches of re, with keywords and
// other rules' matches mixed in.
func corpus(rng *rand.Rand, re *syntax.Regexp, others []*syntax.Regexp, keywords []string, n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		var sb strings.Builder
		parts := 1 + rng.Intn(6)
		for p := 0; p < parts; p++ {
			switch rng.Intn(6) {
			case 0, 1:
				genMatch(rng, re, &sb)
			case 2:
				genMatch(rng, others[rng.Intn(len(others))], &sb)
			case 3:
				if len(keywords) > 0 {
					sb.WriteString(keywords[rng.Intn(len(keywords))])
				}
			default:
				for f := rng.Intn(4); f >= 0; f-- {
					sb.WriteString(fillers[rng.Intn(len(fillers))])
				}
			}
		}
		out = append(out, sb.String())
	}
	return out
}

// runBoth returns a rule's pattern matches in text with its strategy and
// with a plain whole-text search.
func runBoth(rs *ruleset, i int, text string) (fast, plain [][]int) {
	var buf [8]uint64
	cand := buf[:(len(rs.rules)+63)/64]
	var kws []kwHit
	var sc kwScan
	rs.kw.walk(&sc, text, 0, cand, &kws)
	if cand[i/64]&(1<<(i%64)) == 0 {
		return nil, nil // the keyword prefilter rules the text out either way
	}
	r := rs.rules[i]
	if r.windows != nil {
		// Without the entropy bound and the qualified keys, which drop
		// matches that could only yield dropped findings (runFindings
		// covers them).
		r.windows = genericWindowsFor(0, nil)
	}
	fast = r.matches(text, kwsOf(kws, int32(i)), nil)
	plain = r.re.FindAllStringSubmatchIndex(text, -1)
	if len(fast) == 0 && len(plain) == 0 {
		return nil, nil
	}
	return fast, plain
}

// runFindings returns a rule's findings in text with its strategy and with
// a plain whole-text search.
func runFindings(rs *ruleset, i int, text string) (fast, plain []ruleHit) {
	var buf [8]uint64
	cand := buf[:(len(rs.rules)+63)/64]
	var kws []kwHit
	var sc kwScan
	rs.kw.walk(&sc, text, 0, cand, &kws)
	if cand[i/64]&(1<<(i%64)) == 0 {
		return nil, nil
	}
	r := &rs.rules[i]
	fast = r.run(text, kwsOf(kws, int32(i)), 0, len(text), nil, nil)
	for _, m := range r.re.FindAllStringSubmatchIndex(text, -1) {
		plain = r.consider(text, m, 0, len(text), plain)
	}
	return fast, plain
}

// TestStrategiesEquivalent checks, for every rule run with a strategy
// (anchored, windowed, generic windows), that it finds exactly the matches
// a plain search of the whole text finds, on generated texts.
func TestStrategiesEquivalent(t *testing.T) {
	rs, err := loadRuleset()
	if err != nil {
		t.Fatal(err)
	}
	parsed := make([]*syntax.Regexp, len(rs.rules))
	for i, r := range rs.rules {
		p, err := syntax.Parse(r.re.String(), syntax.Perl)
		if err != nil {
			t.Fatal(err)
		}
		parsed[i] = p.Simplify()
	}
	rng := rand.New(rand.NewSource(5))
	n := 60
	if testing.Short() {
		n = 15
	}
	strategies, matched := 0, 0
	for i, r := range rs.rules {
		if r.strategy == nil && r.windows == nil {
			continue
		}
		strategies++
		for _, text := range corpus(rng, parsed[i], parsed, r.keywords, n) {
			fast, plain := runBoth(rs, i, text)
			if len(plain) > 0 {
				matched++
			}
			if !reflect.DeepEqual(fast, plain) {
				t.Fatalf("%s: strategy matched %v, plain search %v in %q", r.id, fast, plain, text)
			}
			ff, pf := runFindings(rs, i, text)
			if !reflect.DeepEqual(ff, pf) {
				t.Fatalf("%s: strategy found %+v, plain search %+v in %q", r.id, ff, pf, text)
			}
		}
	}
	if strategies < 150 {
		t.Errorf("only %d rules run with a strategy", strategies)
	}
	if matched < strategies {
		t.Errorf("corpus too weak: %d texts with findings for %d rules", matched, strategies)
	}
}

func TestGenericWindowsActive(t *testing.T) {
	rs, err := loadRuleset()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs.rules {
		if r.id == ruleGeneric {
			if r.windows == nil {
				t.Fatalf("%s's pattern changed (gitleaks upgrade?): review genericWindows against it and update genericSource", ruleGeneric)
			}
			return
		}
	}
	t.Fatalf("rule %s missing", ruleGeneric)
}

// TestGenericWindowsBoundaries probes the limits genericWindows relies on
// (gap, operator tail, secret length, prefix, non-ASCII letters,
// terminators) on both sides.
func TestGenericWindowsBoundaries(t *testing.T) {
	rs, err := loadRuleset()
	if err != nil {
		t.Fatal(err)
	}
	gi := -1
	for i, r := range rs.rules {
		if r.id == ruleGeneric {
			gi = i
		}
	}
	secret := "Ab1Cd2Ef3Gh4Ij5Kl6"
	rep := strings.Repeat
	var texts []string
	for gap := 18; gap <= 26; gap++ {
		texts = append(texts, "key"+rep("x", gap)+"="+secret, "key"+rep("x", gap-3)+` '"`+"="+secret)
	}
	for skip := 0; skip <= 10; skip++ {
		texts = append(texts, "token:"+rep(" ", skip)+secret, "token:::="+rep("'", skip)+secret, "token?="+rep("=", skip)+secret)
	}
	for n := 8; n <= 13; n++ {
		texts = append(texts, "api_key="+secret[:n]+";", "api_key="+secret[:n])
	}
	for pre := 45; pre <= 55; pre++ {
		texts = append(texts, rep("a", pre)+"secret="+secret+" ", rep("\u017f", pre)+"secret="+secret, rep("\u212a", pre)+"key="+secret)
	}
	texts = append(texts,
		"\u017fecret=ABCDEFGHIJKLMNOP0123", "\u212aey... no", "password\u212a\u212a\u212a=ABCDEFghijkl012345",
		"creds => \"Zx9Yw8Vu7Ts6Rq5Po4\"\\n", "auth: Zx9Yw8Vu7Ts6Rq5Po4\\r next", "key="+rep("Zx9Yw8Vu7", 20),
		"key=abc key=Zx9Yw8Vu7Ts6Rq5Po4 token=Zx9Yw8Vu7Ts6Rq5Po5 secret=0", "API_TOKEN||Zx9Yw8Vu7Ts6Rq5Po4",
		"access_token=Zx9Yw8Vu7Ts6Rq5Po4K", "key\u017f\u017f\u212a\u212a=Zx9Yw8Vu7Ts6Rq5Po4", "key=\u017f\u212aZx9Yw8Vu7Ts6Rq5Po4\u017f", "\u212aey=Zx9Yw8Vu7Ts6Rq5Po4", "idempotency_key: Zx9Yw8Vu7Ts6Rq5Po4", "x.cacheKEY=Zx9Yw8Vu7Ts6Rq5Po4",
		"token_sort-key=Zx9Yw8Vu7Ts6Rq5Po4", rep("a", 44)+"routing_key=Zx9Yw8Vu7Ts6Rq5Po4", "cache key=Zx9Yw8Vu7Ts6Rq5Po4", "key=abc \u212aey=Zx9Yw8Vu7Ts6Rq5Po4", "secret: x, \u017fecret: Zx9Yw8Vu7Ts6Rq5Po4", "key: é"+secret, "key:\t`"+secret+"`",
	)
	for _, text := range texts {
		fast, plain := runBoth(rs, gi, text)
		if !reflect.DeepEqual(fast, plain) {
			t.Errorf("strategy matched %v, plain search %v in %q", fast, plain, text)
		}
		ff, pf := runFindings(rs, gi, text)
		if !reflect.DeepEqual(ff, pf) {
			t.Errorf("strategy found %+v, plain search %+v in %q", ff, pf, text)
		}
	}
}

// FuzzStrategies compares strategy and plain search on arbitrary text for
// the rules with the commonest keywords.
func FuzzStrategies(f *testing.F) {
	rs, err := loadRuleset()
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		`api_key = "0123456789abcdefABCDEF"`, "token: ghp_" + strings.Repeat("a1B2", 9),
		"they said eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijklmnop", "s.abcdefghijklmnopqrstuvwx ok",
		"\u017fecret=ABCDEFGHIJKLMNOP0123", "\u212aey: Zx9Yw8Vu7Ts6Rq5Po4", "AUTH_TOKEN => 'x9y8z7w6v5u4t3s2r1q0'", "lob_key: test_0123456789abcdef0123456789abcdef012",
	} {
		f.Add(s)
	}
	var ids []int
	for i, r := range rs.rules {
		if r.strategy != nil || r.windows != nil {
			ids = append(ids, i)
		}
	}
	f.Fuzz(func(t *testing.T, text string) {
		for _, i := range ids {
			fast, plain := runBoth(rs, i, text)
			if !reflect.DeepEqual(fast, plain) {
				t.Fatalf("%s: strategy matched %v, plain search %v in %q", rs.rules[i].id, fast, plain, text)
			}
			ff, pf := runFindings(rs, i, text)
			if !reflect.DeepEqual(ff, pf) {
				t.Fatalf("%s: strategy found %+v, plain search %+v in %q", rs.rules[i].id, ff, pf, text)
			}
		}
	})
}
