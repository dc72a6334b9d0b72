package redact

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/spf13/viper"
	"github.com/zricethezav/gitleaks/v8/config"
)

// The detection ruleset is gitleaks' default configuration (the
// gitleaks.toml embedded in github.com/zricethezav/gitleaks/v8/config,
// Copyright (c) 2019 Zachary Rice, MIT License), translated by gitleaks'
// own config.ViperConfig.Translate so that its rules, keywords, entropy
// thresholds and allowlists mean here what they mean in gitleaks. Upgrading
// the gitleaks module upgrades the ruleset.
//
// Differences from a gitleaks file scan, all because Talos scans JSON
// values, not files:
//   - a payload has no file path, so rules tied to one (Rule.Path: pkcs12
//     files, Terraform, NuGet and Kubernetes secret files) never apply,
//     exactly as gitleaks skips them for a file whose path does not match;
//   - composite rules ([[rules.required]]) are treated as standalone rules
//     (the default ruleset has none; reporting more is the safe side);
//   - a string value is scanned as the text `"<key>": "<value>"` so that
//     rules which need the assignment context (generic-api-key and the
//     vendor rules of the form `<vendor>_key = <value>`) see it, as they
//     would in the serialized document; only bytes of the value are replaced.

// ruleGeneric is gitleaks' catch-all rule; a finding of a more specific rule
// covering the same bytes wins over it (gitleaks' own report filter does
// the same).
const ruleGeneric = "generic-api-key"

// scanRule is one compiled detection rule.
type scanRule struct {
	id          string
	re          *regexp.Regexp
	secretGroup int
	entropy     float64
	keywords    []string
	allowlists  []*config.Allowlist
	generic     bool
	// checks are the rule's allowlists and the global ones, cheapest first
	// (a finding is dropped if any allows it, so order is free).
	checks []*config.Allowlist
	// windows, if set, narrows where the regex can match (see generic.go):
	// Go's regexp costs up to a microsecond per byte on gitleaks' larger
	// patterns, so a rule with common keywords must not scan whole texts.
	windows func(text string, kws []kwHit, dst [][2]int) [][2]int
	// strategy, if set, runs the rule only around its keywords'
	// occurrences (see anchor.go).
	strategy *strategy
}

// ruleset is the compiled, immutable detection ruleset shared by every
// Redactor in the process.
type ruleset struct {
	rules  []scanRule
	global []*config.Allowlist
	kw     *keywordIndex
	always []int // rules without keywords: run on every long-enough string
}

// gapFiller is a Talos rule for a kind of secret the gitleaks default
// ruleset does not cover in tool payloads. why says which gap it fills.
type gapFiller struct {
	id          string
	why         string
	regex       string
	secretGroup int
	entropy     float64
	keywords    []string
	allowRegex  []string // allowlist regexes on the secret
}

// letterOnly mirrors gitleaks' generic-api-key allowlist: a "secret" made of
// letters, '_', '.' and '-' only is a word, not a credential.
const letterOnly = `^[a-zA-Z_.-]+$`

var gapFillers = []gapFiller{
	{
		id: "authorization-header",
		why: "gitleaks finds Authorization headers only inside curl command " +
			"lines (curl-auth-header); tool results carry raw HTTP headers and logs",
		regex: `(?i)\bauthorization["']?[ \t]*[:=][ \t]*["']?` + // also inside Proxy-Authorization
			`(?:(?:bearer|basic|token|digest|negotiate|apikey|api-key|sso-key)[ \t]+)?` +
			`([A-Za-z0-9\-._~+/]{8,}=*)`,
		secretGroup: 1,
		entropy:     2.75, // gitleaks' curl-auth-header threshold
		keywords:    []string{"authorization"},
		allowRegex:  []string{letterOnly},
	},
	{
		id: "bearer-token",
		why: "\"Bearer <token>\" outside an Authorization header (error " +
			"messages, configs, prose); gitleaks has only vendor-specific bearer rules",
		regex:       `(?i)\bbearer[ \t]+([A-Za-z0-9\-._~+/]{16,}=*)`,
		secretGroup: 1,
		entropy:     3,
		keywords:    []string{"bearer"},
		allowRegex:  []string{letterOnly},
	},
	{
		id: "private-key-block",
		why: "gitleaks' private-key rule needs the END line; tool output cut " +
			"short (head, paging, size limits) leaves a key body without it",
		regex: `(?i)-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----` +
			`(?:[\s\S]*?-----END[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----|[\s\S]*$)`,
		keywords: []string{"-----begin"},
	},
}

// dataKeyQualifiers name kinds of "key" that identify data rather than
// unlock it; generic-api-key fires on "<qualifier>_key = <id>" otherwise.
// The envelope's idempotency_key is a column of talos.tool_calls anyway,
// and cache, object, partition, sort and routing keys are identifiers.
// Talos adds them to the rule's allowlist (on the match, as gitleaks' own
// "primary_key"/"foreign_key" entries), and genericWindows skips such "key"
// occurrences, since any match through them would be allowlisted.
var dataKeyQualifiers = []string{"idempotency", "cache", "object", "partition", "sort", "routing", "dedup", "dedupe", "deduplication"}

// ungroupedWords is a regex of gitleaks' global allowlist whose anchors
// bind to its first and last alternatives only: it allows every secret
// that starts with "true", holds "false" anywhere or ends in "null" (a
// random token does, about once in 30,000). anchoredWords is its intent,
// a value that is one of the three words, which is what Talos applies.
const (
	ungroupedWords = `(?i)^true|false|null$`
	anchoredWords  = `(?i)^(?:true|false|null)$`
)

// anchorAllowlistWords replaces each allowlist of als that holds
// ungroupedWords by a copy with anchoredWords (gitleaks joins an
// allowlist's regexes once, when it is validated).
func anchorAllowlistWords(als []*config.Allowlist) error {
	for i, a := range als {
		at := slices.IndexFunc(a.Regexes, func(re *regexp.Regexp) bool { return re.String() == ungroupedWords })
		if at < 0 {
			continue
		}
		fixed := &config.Allowlist{Description: a.Description, MatchCondition: a.MatchCondition, Commits: a.Commits,
			Paths: a.Paths, RegexTarget: a.RegexTarget, Regexes: slices.Clone(a.Regexes), StopWords: a.StopWords}
		fixed.Regexes[at] = regexp.MustCompile(anchoredWords)
		if err := fixed.Validate(); err != nil {
			return fmt.Errorf("redact: gitleaks global allowlist: %w", err)
		}
		als[i] = fixed
	}
	return nil
}

// dataKeyAllow is the allowlist pattern for dataKeyQualifiers.
func dataKeyAllow() string {
	return `(?i)(?:` + strings.Join(dataKeyQualifiers, "|") + `)[_.-]?key`
}

// loadRuleset compiles the default ruleset once per process: the regexes
// cost tens of milliseconds, and the result is immutable.
var loadRuleset = sync.OnceValues(func() (*ruleset, error) {
	return buildRuleset(config.DefaultConfig)
})

// buildRuleset translates a gitleaks TOML configuration and adds the Talos
// gap fillers.
func buildRuleset(toml string) (rs *ruleset, err error) {
	defer func() {
		// gitleaks compiles patterns with MustCompile.
		if p := recover(); p != nil {
			rs, err = nil, fmt.Errorf("redact: gitleaks ruleset: %v", p)
		}
	}()
	cfg, err := translateGitleaks(toml)
	if err != nil {
		return nil, err
	}
	rs = &ruleset{global: cfg.Allowlists}
	if err := anchorAllowlistWords(rs.global); err != nil {
		return nil, err
	}
	if rs.rules, err = contentRules(&cfg); err != nil {
		return nil, err
	}
	if len(rs.rules) == 0 {
		return nil, errors.New("redact: gitleaks ruleset has no content rules")
	}
	if rs.rules, err = appendGapFillers(rs.rules); err != nil {
		return nil, err
	}
	for i := range rs.rules {
		r := &rs.rules[i]
		if r.windows == nil {
			r.strategy = strategyFor(r.re, r.keywords)
		}
		r.checks = append(append([]*config.Allowlist(nil), r.allowlists...), rs.global...)
		sort.SliceStable(r.checks, func(a, b int) bool { return allowlistCost(r.checks[a]) < allowlistCost(r.checks[b]) })
	}
	rs.indexKeywords()
	return rs, nil
}

// translateGitleaks reads a gitleaks TOML configuration.
func translateGitleaks(toml string) (config.Config, error) {
	v := viper.New()
	v.SetConfigType("toml")
	if err := v.ReadConfig(strings.NewReader(toml)); err != nil {
		return config.Config{}, fmt.Errorf("redact: gitleaks ruleset: %w", err)
	}
	var vc config.ViperConfig
	if err := v.Unmarshal(&vc); err != nil {
		return config.Config{}, fmt.Errorf("redact: gitleaks ruleset: %w", err)
	}
	cfg, err := vc.Translate()
	if err != nil {
		return config.Config{}, fmt.Errorf("redact: gitleaks ruleset: %w", err)
	}
	return cfg, nil
}

// contentRules are the rules of cfg that match content (not paths) and
// report, in cfg's order. The generic rule gets its windows, when it is
// gitleaks' own, and the allowlist of non-credential identifiers.
func contentRules(cfg *config.Config) ([]scanRule, error) {
	var rules []scanRule
	for _, id := range cfg.OrderedRules {
		r, ok := cfg.Rules[id]
		if !ok || r.Regex == nil || r.Path != nil || r.SkipReport {
			continue
		}
		sr := scanRule{
			id:          r.RuleID,
			re:          r.Regex,
			secretGroup: r.SecretGroup,
			entropy:     r.Entropy,
			keywords:    r.Keywords,
			allowlists:  r.Allowlists,
			generic:     strings.Contains(r.RuleID, "generic"),
		}
		if r.RuleID == ruleGeneric && r.Regex.String() == genericSource {
			sr.windows = genericWindowsFor(r.Entropy, dataKeyQualifiers)
		}
		if r.RuleID == ruleGeneric {
			al := &config.Allowlist{
				Description: "talos: non-credential identifiers",
				RegexTarget: "match",
				Regexes:     compileAll([]string{dataKeyAllow()}),
			}
			if err := al.Validate(); err != nil {
				return nil, fmt.Errorf("redact: generic allowlist: %w", err)
			}
			sr.allowlists = append(append([]*config.Allowlist(nil), sr.allowlists...), al)
		}
		rules = append(rules, sr)
	}
	return rules, nil
}

// appendGapFillers appends the Talos gap fillers to rules.
func appendGapFillers(rules []scanRule) ([]scanRule, error) {
	for _, g := range gapFillers {
		sr := scanRule{
			id:          g.id,
			re:          regexp.MustCompile(g.regex),
			secretGroup: g.secretGroup,
			entropy:     g.entropy,
			keywords:    g.keywords,
		}
		if len(g.allowRegex) > 0 {
			al := &config.Allowlist{Regexes: compileAll(g.allowRegex)}
			if err := al.Validate(); err != nil {
				return nil, fmt.Errorf("redact: %s allowlist: %w", g.id, err)
			}
			sr.allowlists = []*config.Allowlist{al}
		}
		rules = append(rules, sr)
	}
	return rules, nil
}

// indexKeywords indexes the rules by keyword (lower case); a rule without
// keywords runs on every string.
func (rs *ruleset) indexKeywords() {
	byKeyword := map[string][]int{}
	for i, r := range rs.rules {
		if len(r.keywords) == 0 {
			rs.always = append(rs.always, i)
			continue
		}
		for _, k := range r.keywords {
			k = strings.ToLower(k)
			if k != "" {
				byKeyword[k] = append(byKeyword[k], i)
			}
		}
	}
	positional := make([]bool, len(rs.rules))
	for i, r := range rs.rules {
		positional[i] = r.windows != nil || r.strategy != nil
	}
	rs.kw = newKeywordIndex(byKeyword, positional)
}

// allowlistCost estimates what checking an allowlist costs: Go's regexp
// runs in time proportional to pattern size.
func allowlistCost(a *config.Allowlist) int {
	n := len(a.StopWords)
	for _, re := range a.Regexes {
		n += len(re.String())
	}
	if a.RegexTarget == "line" {
		n *= 4
	}
	return n
}

func compileAll(patterns []string) []*regexp.Regexp {
	out := make([]*regexp.Regexp, len(patterns))
	for i, p := range patterns {
		out[i] = regexp.MustCompile(p)
	}
	return out
}

// ruleHit is one secret found in a scanned text: [start, end) in the
// caller's value, the rule and the secret bytes.
type ruleHit struct {
	start, end int
	rule       string
	generic    bool
	secret     string
}

// minRegexLen: strings shorter than this are not run through regex rules.
const minRegexLen = 8

// scan runs the rules whose keywords occur in the text over it and returns
// the secrets that lie in value, with offsets relative to value. The text
// is value alone, or, when the value is an object member, the member as
// serialized JSON shows it, `"<ctx>": "<value>"`, so that rules needing the
// assignment context see it.
//
// cover are spans of value already found by position: a generic-rule
// match inside one would be dropped (see replaceSpans), so its allowlists
// are not run.
func (rs *ruleset) scan(ctx, value string, cover []found) []ruleHit {
	if len(value) < minRegexLen {
		return nil
	}
	var buf [8]uint64
	words := (len(rs.rules) + 63) / 64
	var cand []uint64
	if words <= len(buf) {
		cand = buf[:words]
	} else {
		cand = make([]uint64, words)
	}
	var kwBuf [16]kwHit
	kws := kwBuf[:0]
	var sc kwScan
	prefixLen := 0
	if ctx != "" {
		rs.kw.walk(&sc, `"`, 0, cand, &kws)
		rs.kw.walk(&sc, ctx, 1, cand, &kws)
		rs.kw.walk(&sc, `": "`, 1+len(ctx), cand, &kws)
		prefixLen = len(ctx) + 5
	}
	rs.kw.walk(&sc, value, prefixLen, cand, &kws)
	if ctx != "" {
		rs.kw.walk(&sc, `"`, prefixLen+len(value), cand, &kws)
	}
	for _, i := range rs.always {
		cand[i/64] |= 1 << (i % 64)
	}
	found := false
	for _, w := range cand {
		if w != 0 {
			found = true
			break
		}
	}
	if !found {
		return nil
	}

	text := value
	if ctx != "" {
		text = `"` + ctx + `": "` + value + `"`
	}
	lo, hi := prefixLen, prefixLen+len(value)
	var hits []ruleHit
	for _, c := range cover {
		hits = append(hits, ruleHit{start: c.start, end: c.end})
	}
	var winBuf [4][2]int
	// Specific rules first: a generic finding inside a specific one is
	// dropped before its (costly) allowlists run.
	for pass := 0; pass < 2; pass++ {
		for wi, w := range cand {
			for w != 0 {
				bit := w & -w
				w &^= bit
				i := wi*64 + bits.TrailingZeros64(bit)
				r := &rs.rules[i]
				if r.generic != (pass == 1) {
					continue
				}
				hits = r.run(text, kwsOf(kws, int32(i)), lo, hi, hits, winBuf[:0])
			}
		}
	}
	return hits[len(cover):]
}

// run applies the rule to text with its strategy and turns its matches
// into findings.
func (r *scanRule) run(text string, kws []kwHit, lo, hi int, hits []ruleHit, winBuf [][2]int) []ruleHit {
	for _, m := range r.matches(text, kws, winBuf) {
		hits = r.consider(text, m, lo, hi, hits)
	}
	return hits
}

// matches returns the rule's pattern matches in text (submatch indexes,
// as FindAllStringSubmatchIndex on the whole text would), searching only
// where its strategy says a match can be.
func (r *scanRule) matches(text string, kws []kwHit, winBuf [][2]int) [][]int {
	switch {
	case r.strategy != nil && r.strategy.anchored != nil:
		return r.matchAnchored(text, kws)
	case r.strategy != nil:
		return r.matchWindows(text, r.strategy.windows(text, kws, winBuf))
	case r.windows != nil:
		return r.matchWindows(text, r.windows(text, kws, winBuf))
	}
	return r.re.FindAllStringSubmatchIndex(text, -1)
}

// matchWindows searches each window.
func (r *scanRule) matchWindows(text string, wins [][2]int) [][]int {
	var out [][]int
	for _, w := range wins {
		for _, m := range r.re.FindAllStringSubmatchIndex(text[w[0]:w[1]], -1) {
			for k := range m {
				if m[k] >= 0 {
					m[k] += w[0]
				}
			}
			out = append(out, m)
		}
	}
	return out
}

// kwsOf returns the keyword hits of one rule (the slice is shared by every
// positional rule of the text).
func kwsOf(kws []kwHit, rule int32) []kwHit {
	all := true
	for _, k := range kws {
		if k.rule != rule {
			all = false
			break
		}
	}
	if all {
		return kws
	}
	var out []kwHit
	for _, k := range kws {
		if k.rule == rule {
			out = append(out, k)
		}
	}
	return out
}

// consider turns one match (submatch indexes into text) into a finding,
// applying gitleaks' secret-group, entropy and allowlist semantics, and
// keeps the part of the secret inside text[lo:hi].
func (r *scanRule) consider(text string, m []int, lo, hi int, hits []ruleHit) []ruleHit {
	ms, me := m[0], m[1]
	// gitleaks trims newlines around the match.
	for ms < me && text[ms] == '\n' {
		ms++
	}
	for me > ms && text[me-1] == '\n' {
		me--
	}
	ss, se := ms, me
	if n := len(m)/2 - 1; n >= 1 {
		if r.secretGroup > 0 {
			if r.secretGroup > n {
				return hits
			}
			ss, se = m[2*r.secretGroup], m[2*r.secretGroup+1]
		} else {
			for g := 1; g <= n; g++ {
				if m[2*g] >= 0 && m[2*g+1] > m[2*g] {
					ss, se = m[2*g], m[2*g+1]
					break
				}
			}
		}
	}
	if ss < 0 || se <= ss {
		return hits
	}
	if r.generic && covered(hits, ss-lo, se-lo) {
		return hits
	}
	secret := text[ss:se]
	if r.entropy != 0 && shannonEntropy(secret) <= r.entropy {
		return hits
	}
	if allowed(r.checks, secret, text[ms:me], text, ms, me) {
		return hits
	}
	// Keep only the bytes of the value.
	if ss < lo {
		ss = lo
	}
	if se > hi {
		se = hi
	}
	if se <= ss {
		return hits
	}
	return append(hits, ruleHit{start: ss - lo, end: se - lo, rule: r.id, generic: r.generic, secret: text[ss:se]})
}

// covered reports whether a specific rule's finding spans [start, end).
func covered(hits []ruleHit, start, end int) bool {
	for _, h := range hits {
		if !h.generic && h.start <= start && end <= h.end {
			return true
		}
	}
	return false
}

// allowed applies gitleaks allowlists to a finding (detect.checkFindingAllowed):
// with condition AND every configured check must hold, and checks on
// commits and paths never hold for a payload.
func allowed(als []*config.Allowlist, secret, match, text string, ms, me int) bool {
	for _, a := range als {
		if a == nil {
			continue
		}
		target := secret
		switch a.RegexTarget {
		case "match":
			target = match
		case "line":
			target = lineAround(text, ms, me)
		}
		if a.MatchCondition != config.AllowlistMatchAnd {
			if stop, _ := a.ContainsStopWord(secret); stop || a.RegexAllowed(target) {
				return true
			}
			continue
		}
		if len(a.Commits) > 0 || len(a.Paths) > 0 || (len(a.Regexes) == 0 && len(a.StopWords) == 0) {
			continue
		}
		if len(a.Regexes) > 0 && !a.RegexAllowed(target) {
			continue
		}
		if stop, _ := a.ContainsStopWord(secret); len(a.StopWords) > 0 && !stop {
			continue
		}
		return true
	}
	return false
}

// lineAround returns the line(s) of text containing [ms, me).
func lineAround(text string, ms, me int) string {
	start := strings.LastIndexByte(text[:ms], '\n') + 1
	end := strings.IndexByte(text[me:], '\n')
	if end < 0 {
		return text[start:]
	}
	return text[start : me+end]
}

// shannonEntropy is gitleaks' entropy measure (detect.shannonEntropy).
func shannonEntropy(s string) float64 {
	if s == "" {
		return 0
	}
	inv := 1 / float64(len(s))
	var e float64
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		var counts [128]int
		for i := 0; i < len(s); i++ {
			counts[s[i]]++
		}
		for _, n := range counts {
			if n > 0 {
				f := float64(n) * inv
				e -= f * math.Log2(f)
			}
		}
		return e
	}
	counts := make(map[rune]int, 32)
	for _, c := range s {
		counts[c]++
	}
	for _, n := range counts {
		f := float64(n) * inv
		e -= f * math.Log2(f)
	}
	return e
}

// kwHit is where a keyword of a positional rule occurs: [start, end) in
// the scanned text.
type kwHit struct {
	rule       int32
	start, end int32
}

// kwOut is one keyword ending at an automaton state.
type kwOut struct {
	rule       int32
	n          int32 // keyword length
	positional bool
}

// keywordIndex is an Aho-Corasick automaton over the rules' keywords,
// matched ASCII-case-insensitively: one linear pass over a text yields the
// set of rules worth running on it (gitleaks' keyword prefilter) and, for
// positional rules, where their keywords are.
type keywordIndex struct {
	class  [256]uint8 // lowercased byte -> symbol class; 0: in no keyword
	nclass int
	delta  []int32   // state*nclass + class -> next state (complete DFA)
	out    [][]kwOut // state -> keywords ending here (via suffix links)
	// final marks the states with keywords ending there: a small table the
	// walk reads for every byte, where out is not.
	final []bool
}

func newKeywordIndex(byKeyword map[string][]int, positional []bool) *keywordIndex {
	k := &keywordIndex{nclass: 1}
	kws := make([]string, 0, len(byKeyword))
	for w := range byKeyword {
		kws = append(kws, w)
	}
	sort.Strings(kws)
	for _, w := range kws {
		for i := 0; i < len(w); i++ {
			if k.class[w[i]] == 0 && k.nclass < 256 {
				k.class[w[i]] = uint8(k.nclass)
				k.nclass++
			}
		}
	}
	for c := 'A'; c <= 'Z'; c++ {
		k.class[c] = k.class[c+'a'-'A']
	}
	newState := func() int32 {
		for i := 0; i < k.nclass; i++ {
			k.delta = append(k.delta, -1)
		}
		k.out = append(k.out, nil)
		return int32(len(k.out) - 1)
	}
	newState() // root
	for _, w := range kws {
		s := int32(0)
		for i := 0; i < len(w); i++ {
			c := int(k.class[w[i]])
			next := k.delta[int(s)*k.nclass+c]
			if next < 0 {
				next = newState()
				k.delta[int(s)*k.nclass+c] = next
			}
			s = next
		}
		for _, r := range byKeyword[w] {
			k.out[s] = append(k.out[s], kwOut{rule: int32(r), n: int32(len(w)), positional: positional[r]})
		}
	}
	// Breadth-first: failure links, complete transitions, merged outputs.
	fail := make([]int32, len(k.out))
	queue := make([]int32, 0, len(k.out))
	for c := 0; c < k.nclass; c++ {
		if n := k.delta[c]; n > 0 {
			fail[n] = 0
			queue = append(queue, n)
		} else {
			k.delta[c] = 0
		}
	}
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		for c := 0; c < k.nclass; c++ {
			v := k.delta[int(u)*k.nclass+c]
			f := k.delta[int(fail[u])*k.nclass+c]
			if v < 0 {
				k.delta[int(u)*k.nclass+c] = f
				continue
			}
			fail[v] = f
			if len(k.out[f]) > 0 {
				k.out[v] = append(append([]kwOut(nil), k.out[v]...), k.out[f]...)
			}
			queue = append(queue, v)
		}
	}
	k.final = make([]bool, len(k.out))
	for st, o := range k.out {
		k.final[st] = len(o) > 0
	}
	return k
}

// kwScan is the automaton's progress through the parts of one text.
type kwScan struct {
	st    int32
	chars int // characters fed so far
	// folds lists the folded characters (ſ, K), which take more than one
	// byte: where a keyword ends is known, and where it starts is its
	// length before it, plus the extra bytes of the folds inside it.
	folds []fold
}

// fold is one folded character: its index among the characters fed and
// the bytes it takes beyond one.
type fold struct {
	char  int
	extra int32
}

// walk advances the automaton over s (which starts at offset off of the
// scanned text), setting the bit of every rule whose keyword occurs and
// appending the positions of positional rules' keywords to kws. Besides
// ASCII case, it folds U+017F (long s) onto s and U+212A (Kelvin sign) onto
// k, the two non-ASCII letters Go's (?i) matches for ASCII ones, so that a
// keyword written with them is found where the rule's pattern would match.
func (k *keywordIndex) walk(sc *kwScan, s string, off int, bits []uint64, kws *[]kwHit) {
	nc := int32(k.nclass)
	st := sc.st
	chars := sc.chars
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf {
			switch {
			case c == 0xC5 && i+1 < len(s) && s[i+1] == 0xBF:
				c, i = 's', i+1
				sc.folds = append(sc.folds, fold{char: chars, extra: 1})
			case c == 0xE2 && i+2 < len(s) && s[i+1] == 0x84 && s[i+2] == 0xAA:
				c, i = 'k', i+2
				sc.folds = append(sc.folds, fold{char: chars, extra: 2})
			}
		}
		chars++
		st = k.delta[st*nc+int32(k.class[c])]
		if k.final[st] {
			for _, h := range k.out[st] {
				bits[h.rule/64] |= 1 << (h.rule % 64)
				if h.positional {
					end := int32(off + i + 1)
					start := end - h.n
					for j := len(sc.folds) - 1; j >= 0 && sc.folds[j].char >= chars-int(h.n); j-- {
						start -= sc.folds[j].extra
					}
					*kws = append(*kws, kwHit{rule: h.rule, start: start, end: end})
				}
			}
		}
	}
	sc.st = st
	sc.chars = chars
}
