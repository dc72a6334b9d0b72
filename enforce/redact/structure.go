package redact

import (
	"regexp"
	"strings"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Redaction by position. A value is a secret because of where it sits,
// whatever it looks like: after a secret-named KEY= or key: inside text
// (env files, YAML, INI, properties, HTTP header lines, JSON or YAML
// embedded in a string), in a connection string's Password=/AccountKey=
// pair, in a URL's userinfo or secret-named query parameter, or after a
// secret-named command-line flag (shell.go). Each value is read up to the
// delimiter of its format, following that format's quoting rules, so a
// value may begin or end with any character the format allows.
//
// Where the format is ambiguous (a ';' in an env value could end a
// connection-string pair), the scanner redacts the longer reading and
// records a finding for each reading, so no reading leaks and a keyed
// pseudonym lookup finds the value under either.

// Rule names of positional findings.
const (
	// RuleSecretAssignment: the value of a secret-named pair in text.
	RuleSecretAssignment = "secret-assignment"
	// RuleSecretFlag: the value of a secret-named command-line flag.
	RuleSecretFlag = "secret-flag"
	// RuleURLPassword: the password in a URL's userinfo.
	RuleURLPassword = "url-userinfo-password"
)

// found is one positional finding: [start, end) of the scanned text is
// replaced, secret is the value as its format decodes it (what the
// pseudonym is computed over).
type found struct {
	start, end int
	rule       string
	secret     string
}

// Limits of the scanner.
const (
	// maxQuoteScan bounds how far a quoted value or bracketed value is
	// followed before the scanner falls back to the end of the line.
	maxQuoteScan = 64 << 10
	// maxLineScan bounds how far back the scanner looks for an enclosing
	// quote.
	maxLineScan = 4 << 10
	// maxAuthority bounds how far a URL's '@' is looked for past a raw
	// '/', '?' or '#' in its password.
	maxAuthority = 256
)

// positional returns the positional findings in s.
func (r *Redactor) positional(s string, out []found) []found {
	return r.positionalDepth(s, out, 0)
}

// positionalDepth is positional for text found inside a quoted shell
// word depth levels down.
func (r *Redactor) positionalDepth(s string, out []found, depth int) []found {
	if len(s) < 3 {
		return out
	}
	n := len(out)
	out = urlPasswords(s, out)
	out = r.assignments(s, out)
	if depth < maxShellDepth && len(out) > n {
		out = r.inEscapedStrings(s, out, n, depth)
	}
	// A secret found in text that quotes or escapes may have been read
	// through quoting the text scanner does not know: read it again as
	// shell words.
	reread := depth == 0 && len(out) > n && strings.ContainsAny(s, "\"'\\")
	var lines []int
	if reread {
		for _, f := range out[n:] {
			lines = append(lines, f.start)
		}
	}
	return r.shellWords(s, out, depth, reread, lines)
}

// urlAuthorityStop marks the bytes that end a URL's authority (RFC 3986:
// '/', '?', '#'; and what never occurs in a URL written in text). A
// backslash does not: a URL inside escaped text (\" in JSON, \$ in a shell
// string) keeps its escapes in its userinfo.
var urlAuthorityStop = byteSet("/?#\"<>`{}|^ \t\r\n\f\v\x00")

// urlTextStop marks the bytes that end a URL written in text.
var urlTextStop = byteSet("\"<>` \t\r\n\f\v\x00")

// urlPasswords finds the password of every scheme://user:password@host
// in s: the userinfo ends at the last '@' of the authority, so a password
// may hold any character RFC 3986 allows there (and a raw '@'). A raw '/',
// '?' or '#' in a password ends the authority early; when what follows
// the first ':' is not a port, the '@' is looked for up to the end of the
// URL instead.
func urlPasswords(s string, out []found) []found {
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], "://")
		if j < 0 {
			break
		}
		p := i + j
		i = p + 3
		if p == 0 || !isSchemeChar(s[p-1]) {
			continue
		}
		a := p + 3
		if a < len(s) && s[a] == '[' { // IPv6 literal, no userinfo
			continue
		}
		end := a
		for end < len(s) && !urlAuthorityStop[s[end]] && s[end] >= 0x20 {
			end++
		}
		at := strings.LastIndexByte(s[a:end], '@')
		if at < 0 {
			c := strings.IndexByte(s[a:end], ':')
			if c < 0 || end == len(s) || urlTextStop[s[end]] || allDigits(s[a+c+1:end]) {
				continue
			}
			e2 := end
			for e2 < len(s) && e2-a < maxAuthority && !urlTextStop[s[e2]] && s[e2] >= 0x20 {
				e2++
			}
			if at = strings.LastIndexByte(s[a:e2], '@'); at < 0 {
				continue
			}
		}
		at += a
		c := strings.IndexByte(s[a:at], ':')
		if c < 0 || a+c+1 == at {
			i = at + 1
			continue
		}
		out = append(out, found{start: a + c + 1, end: at, rule: RuleURLPassword, secret: s[a+c+1 : at]})
		i = at + 1
	}
	return out
}

func isSchemeChar(c byte) bool { return isAlnum(c) || c == '+' || c == '.' || c == '-' }

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// opKind is the operator of a pair.
type opKind uint8

const (
	opEq     opKind = iota // NAME=value (shell, env, query, connection string)
	opSpaced               // name = value, name := value (INI, TOML, code)
	opArrow                // 'name' => value
	opColon                // name: value (YAML, HTTP headers, JSON)
)

// pair is one name/operator occurrence being examined.
type pair struct {
	nameStart, nameEnd int // the name, without quotes
	quoteLevel         int // 0: unquoted name; n: quoted with n-1 levels of backslash escaping
	op                 opKind
	valueStart         int // after the operator and blanks
	name               string
}

// nameByte marks the bytes of an unquoted name.
var nameByte = byteSet(wordChars + ".-")

// pairScan is what the scan of one text learns once and reuses for each
// of its pairs: whether the text reads as an env file, and the quoting
// state of the line, followed from pair to pair (pairs come in order).
type pairScan struct {
	env   int8 // 0 unknown, 1 yes, -1 no
	quote struct {
		valid          bool
		pos, lineStart int  // scanned up to pos, on the line starting at lineStart
		whole          bool // lineStart is the line's start, not maxLineScan back
		q              byte // the open quote at pos, or 0
		at             int  // where it opened
	}
}

// envFile reports whether s reads as an env file (see envFileLike).
func (ps *pairScan) envFile(s string) bool {
	if ps.env == 0 {
		ps.env = -1
		if envFileLike(s) {
			ps.env = 1
		}
	}
	return ps.env > 0
}

// enclosing returns the quote of the string position p lies inside, on
// its line (0 when none: a pair written inside a quoted string ends where
// that string ends), continuing from the previous call when p is further
// along the same line.
func (ps *pairScan) enclosing(s string, p int) byte {
	t := &ps.quote
	if p <= 0 {
		return 0
	}
	if !t.valid || p < t.pos || strings.IndexByte(s[t.pos:p], '\n') >= 0 {
		// A line too long to look back on is followed from a point
		// maxLineScan back, as if no quote were open there.
		ls, whole := lineStartWithin(s, p, maxLineScan)
		t.valid, t.pos, t.lineStart, t.whole, t.q, t.at = true, ls, ls, whole, 0, -1
	}
	t.q, t.at, t.pos = scanQuotes(s, t.lineStart, t.pos, p, t.q, t.at)
	return t.q
}

// lineStart returns the start of the line holding p, which must be where
// enclosing was last asked about (or on the same line); ok is false when
// the line is too long to tell.
func (ps *pairScan) lineStart(s string, p int) (int, bool) {
	ps.enclosing(s, p)
	return ps.quote.lineStart, ps.quote.whole
}

// assignments finds the values of secret-named pairs in s.
func (r *Redactor) assignments(s string, out []found) []found {
	var ps pairScan
	nextEq, nextColon := -2, -2
	for i := 0; i < len(s); {
		if nextEq < i && nextEq != -1 {
			if k := strings.IndexByte(s[i:], '='); k >= 0 {
				nextEq = i + k
			} else {
				nextEq = -1
			}
		}
		if nextColon < i && nextColon != -1 {
			if k := strings.IndexByte(s[i:], ':'); k >= 0 {
				nextColon = i + k
			} else {
				nextColon = -1
			}
		}
		p := nextEq
		if p < 0 || (nextColon >= 0 && nextColon < p) {
			p = nextColon
		}
		if p < 0 {
			break
		}
		pr, next, ok := operatorAt(s, p)
		i = next
		if !ok || !r.nameAt(s, p, &pr) {
			continue
		}
		n := len(out)
		out = r.pairValue(s, &pr, &ps, out)
		// Pairs inside a value just redacted are redacted with it: go on
		// after it (which also keeps the scan linear in long lines).
		for _, f := range out[n:] {
			i = max(i, resumeAt(s, p, f.end))
		}
	}
	return out
}

// resumeAt is where a scan that found a value ending at end, from a pair
// at p, goes on: past the value; or, when the value ran onto later lines
// (a quote that closes there, or never), at the next line, whose own
// pairs may end elsewhere and must be recorded as their own.
func resumeAt(s string, p, end int) int {
	nl := strings.IndexByte(s[p:end], '\n')
	if nl < 0 {
		return end
	}
	return p + nl + 1
}

// operatorAt classifies the operator at s[p] ('=' or ':'); next is where
// the search continues.
func operatorAt(s string, p int) (pair, int, bool) {
	pr := pair{}
	next := p + 1
	at := func(k int) byte {
		if k < 0 || k >= len(s) {
			return 0
		}
		return s[k]
	}
	switch s[p] {
	case ':':
		switch {
		case at(p+1) == ':':
			return pr, p + 2, false
		case at(p-1) == ':':
			return pr, next, false
		case at(p+1) == '=':
			pr.op, next = opSpaced, p+2
		default:
			pr.op = opColon
		}
	case '=':
		blankBefore := at(p-1) == ' ' || at(p-1) == '\t'
		switch {
		case (at(p+1) == '=' || at(p+1) == '~') && blankBefore:
			return pr, p + 2, false // a comparison: a == b, s =~ re
		case strings.IndexByte("=!<>", at(p-1)) >= 0 && at(p-1) != 0:
			return pr, next, false // the second byte of ==, !=, <=, >=
		case at(p+1) == '>':
			pr.op, next = opArrow, p+2
		default:
			// NAME=value; NAME==x and NAME=~x are values starting with
			// '=' or '~'.
			pr.op = opEq
		}
	}
	pr.valueStart = next
	return pr, next, true
}

// nameAt finds the name before the operator at p and reports whether it
// names a secret.
func (r *Redactor) nameAt(s string, p int, pr *pair) bool {
	e := p
	if pr.op == opEq && e > 0 && (s[e-1] == '+' || s[e-1] == '?') {
		e--
	}
	spaced := false
	for e > 0 && (s[e-1] == ' ' || s[e-1] == '\t') {
		e--
		spaced = true
	}
	if spaced && pr.op == opEq {
		pr.op = opSpaced
	}
	if e == 0 {
		return false
	}
	if pr.op == opArrow && !spaced && s[e-1] != '"' && s[e-1] != '\'' {
		// NAME=>x: an assignment whose value starts with '>'.
		pr.op, pr.valueStart = opEq, p+1
	}
	if c := s[e-1]; c == '"' || c == '\'' {
		// A quoted name: "password": or 'password' =>.
		bs := backslashesBefore(s, e-1)
		open := strings.LastIndexByte(s[max(0, e-1-maxNameBytes):e-1], c)
		if open < 0 {
			return false
		}
		open += max(0, e-1-maxNameBytes)
		if backslashesBefore(s, open) != bs {
			return false
		}
		pr.nameStart, pr.nameEnd = open+1, e-1-bs
		if pr.nameEnd <= pr.nameStart {
			return false
		}
		pr.quoteLevel = quoteLevelOf(bs)
		if pr.quoteLevel == 0 {
			return false
		}
		for k := pr.nameStart; k < pr.nameEnd; k++ {
			if !nameByte[s[k]] {
				return false
			}
		}
	} else {
		b := e
		for b > 0 && e-b < maxNameBytes && nameByte[s[b-1]] {
			b--
		}
		if b == e || (b > 0 && nameByte[s[b-1]]) {
			return false
		}
		pr.nameStart, pr.nameEnd = b, e
		if b >= 3 && s[b-3:b] == "://" {
			return false // a URL's userinfo: urlPasswords reads it
		}
	}
	pr.name = s[pr.nameStart:pr.nameEnd]
	if len(pr.name) < 2 || allDigits(pr.name) { // 12:34:56, a=1
		return false
	}
	ctx := r.pairContext(s, pr)
	switch {
	case ctx == ctxQuery && queryExtraNames[normalizeName(pr.name)]:
		return true
	case ctx == ctxConnection && connectionStringNames[normalizeName(pr.name)]:
		return true
	}
	return r.names.secret(pr.name)
}

// backslashesBefore counts the backslashes right before s[i].
func backslashesBefore(s string, i int) int {
	n := 0
	for i-n-1 >= 0 && s[i-n-1] == '\\' {
		n++
	}
	return n
}

// quoteLevelOf maps the backslashes before a quote to its nesting level:
// 0 backslashes is a plain quote (1), 1 a quote inside a JSON string (2),
// 3 one more level down (3); other counts are not a quote.
func quoteLevelOf(bs int) int {
	switch bs {
	case 0:
		return 1
	case 1:
		return 2
	case 3:
		return 3
	}
	return 0
}

// pairCtx is the syntax around an '=' pair.
type pairCtx uint8

const (
	ctxPlain      pairCtx = iota
	ctxQuery              // ?name= or &name=
	ctxConnection         // ;name= (a connection string)
)

func (r *Redactor) pairContext(s string, pr *pair) pairCtx {
	if pr.op != opEq || pr.quoteLevel > 0 || pr.nameStart == 0 {
		return ctxPlain
	}
	switch s[pr.nameStart-1] {
	case '?', '&':
		return ctxQuery
	}
	b := pr.nameStart
	for b > 0 && (s[b-1] == ' ' || s[b-1] == '\t') {
		b--
	}
	if b > 0 && s[b-1] == ';' {
		return ctxConnection
	}
	return ctxPlain
}

// pairValue reads the value of a secret-named pair and records it.
func (r *Redactor) pairValue(s string, pr *pair, ps *pairScan, out []found) []found {
	v := pr.valueStart
	if pr.op != opEq {
		for v < len(s) && (s[v] == ' ' || s[v] == '\t') {
			v++
		}
	} else if v < len(s) && (s[v] == ' ' || s[v] == '\t') {
		// NAME= value: an INI-style pair with the blank after the '='.
		pr.op = opSpaced
		for v < len(s) && (s[v] == ' ' || s[v] == '\t') {
			v++
		}
	}
	if v >= len(s) || s[v] == '\n' || s[v] == '\r' {
		if pr.op == opColon {
			return r.blockScalar(s, pr, v, out)
		}
		return out
	}
	enclose := ps.enclosing(s, pr.nameStart-boolInt(pr.quoteLevel > 0))
	c := s[v]
	switch {
	case pr.quoteLevel > 0:
		return r.jsonPairValue(s, pr, v, out)
	case pr.op == opEq:
		return r.shellValue(s, pr, v, enclose, ps, out)
	case c == '"':
		if cs, ce, ok := quotedAt(s, v, 1); ok {
			return r.addSecret(out, s, pr, cs, ce, unescapeLevels(s[cs:ce], 1))
		}
	case c == '\'':
		if cs, ce, ok := singleQuoted(s, v); ok {
			return r.addSecret(out, s, pr, cs, ce, strings.ReplaceAll(s[cs:ce], "''", "'"))
		}
	case c == '{' || c == '[':
		e := balanced(s, v)
		return r.addSecret(out, s, pr, v, e, s[v:e])
	case (c == '|' || c == '>') && pr.op == opColon && blockIndicator(s, v):
		return r.blockScalar(s, pr, v, out)
	}
	return r.plainPairValue(s, pr, v, enclose, out)
}

// addSecret records s[start:end], whose unquoted value is secret, as the
// value of pair pr, unless it is empty, a placeholder, or a pwd that is
// the shell's working directory rather than a password.
func (r *Redactor) addSecret(out []found, s string, pr *pair, start, end int, secret string) []found {
	if end <= start {
		return out
	}
	if placeholder(secret) {
		return out
	}
	if normalizeName(pr.name) == "pwd" && r.pairContext(s, pr) != ctxConnection && (secret[0] == '/' || secret[0] == '~') {
		return out // the shell's working directory, not a password
	}
	return append(out, found{start: start, end: end, rule: RuleSecretAssignment, secret: secret})
}

// jsonPairValue reads the value at s[v] of a pair with a quoted name
// (JSON, or a quoted YAML/Python key): a JSON value.
func (r *Redactor) jsonPairValue(s string, pr *pair, v int, out []found) []found {
	switch c := s[v]; {
	case c == '"' || (c == '\\' && pr.quoteLevel > 1):
		if cs, ce, ok := quotedAt(s, v, pr.quoteLevel); ok {
			return r.addSecret(out, s, pr, cs, ce, unescapeLevels(s[cs:ce], pr.quoteLevel))
		}
	case c == '\'':
		if cs, ce, ok := singleQuoted(s, v); ok {
			return r.addSecret(out, s, pr, cs, ce, strings.ReplaceAll(s[cs:ce], "''", "'"))
		}
	case c == '{' || c == '[':
		e := balanced(s, v)
		return r.addSecret(out, s, pr, v, e, s[v:e])
	}
	e := v
	for e < len(s) && !jsonScalarStop[s[e]] {
		e++
	}
	return r.addSecret(out, s, pr, v, e, s[v:e])
}

// plainPairValue reads an unquoted value at s[v]: to the end of the line,
// the enclosing quote enclose (0: none), or the format's separator.
func (r *Redactor) plainPairValue(s string, pr *pair, v int, enclose byte, out []found) []found {
	e := lineEnd(s, v)
	if enclose != 0 {
		if q := closingQuote(s, v, e, enclose); q >= 0 {
			e = q
		}
	}
	switch {
	case pr.op == opArrow:
		e = v + indexAnyOr(s[v:e], ",)]} \t", e-v)
	case pr.op == opColon && v == pr.valueStart:
		// name:value with no blank: a token, not a YAML value.
		e = v + indexAnyOr(s[v:e], " \t", e-v)
	case pr.op == opColon && flowContext(s, pr.nameStart-boolInt(pr.quoteLevel > 0)):
		e = v + indexAnyOr(s[v:e], ",}]", e-v)
	}
	e = cutComment(s, v, e, pr.op == opSpaced)
	for e > v && (s[e-1] == ' ' || s[e-1] == '\t') {
		e--
	}
	if pr.op == opColon {
		v = skipAuthScheme(s, pr.name, v, e)
	}
	out = r.addSecret(out, s, pr, v, e, s[v:e])
	// A value read to the end of its line may, to its writer, end at its
	// first blank (key = VALUE and then prose): record that reading too.
	if b := strings.IndexAny(s[v:e], " \t"); b > 0 {
		out = r.addSecret(out, s, pr, v, v+b, s[v:v+b])
	}
	return out
}

// shellValue reads the value of NAME=value: a shell word (quotes and
// escapes as the shell reads them) in env files and command lines; up to
// the next '&' in a URL query; up to the next ';' in a connection string,
// with its quoting rules.
func (r *Redactor) shellValue(s string, pr *pair, v int, enclose byte, ps *pairScan, out []found) []found {
	add := func(start, end int, secret string) {
		if end > start && !placeholder(secret) {
			if normalizeName(pr.name) == "pwd" && (secret[0] == '/' || secret[0] == '~') {
				return
			}
			out = append(out, found{start: start, end: end, rule: RuleSecretAssignment, secret: secret})
		}
	}
	switch r.pairContext(s, pr) {
	case ctxQuery:
		e := v
		for e < len(s) && !queryValueStop[s[e]] && s[e] >= 0x20 {
			e++
		}
		add(v, e, s[v:e])
		return out
	case ctxConnection:
		cs, ce, secret := connectionValue(s, v, enclose)
		add(cs, ce, secret)
		if b := strings.IndexAny(secret, " \t"); b > 0 && cs == v {
			add(cs, cs+b, secret[:b])
		}
		return out
	}
	w := readShellWord(s, v, enclose)
	ws, we := w.span()
	if we <= ws {
		return out
	}
	secret := string(w.lit)
	// An env file or a YAML list item holds one assignment per line, and
	// its unquoted value runs to the end of the line.
	if w.end < len(s) && (s[w.end] == ' ' || s[w.end] == '\t') && enclose == 0 && lineStartAssignment(s, pr.nameStart, ps) {
		if dashItem(s, pr.nameStart, ps) || ps.envFile(s) {
			e := cutComment(s, v, lineEnd(s, v), false)
			for e > v && (s[e-1] == ' ' || s[e-1] == '\t') {
				e--
			}
			if e > we {
				ws, we, secret = v, e, s[v:e]
			}
		}
	}
	add(ws, we, secret)
	// An env file does not unquote an unquoted value (a\b stays a\b):
	// record that reading too when the shell's differs.
	if w.quoted && s[v] != '"' && s[v] != '\'' {
		e := v
		for e < len(s) && s[e] != ' ' && s[e] != '\t' && s[e] != '\n' && s[e] != '\r' && (enclose == 0 || s[e] != enclose) {
			e++
		}
		add(v, e, s[v:e])
	}
	// The value might also end a connection-string pair
	// (Password=x;Server=y): record that reading too.
	cs, ce, cv := connectionValue(s, v, enclose)
	k := ce
	if cs > v && k < len(s) { // quoted: past the closing quote
		k++
	}
	if k < len(s) && s[k] == ';' && nextPairAt(s, k+1) && (cs != ws || ce != we) {
		add(cs, ce, cv)
	}
	return out
}

// queryValueStop marks the bytes that end a URL query value.
var queryValueStop = byteSet("&#\"'<>` \t\r\n\f\v")

// jsonScalarStop marks the bytes that end an unquoted JSON value.
var jsonScalarStop = byteSet(",}]\\ \t\r\n")

// connectionValue reads a connection-string value at v: "..." or '...'
// with the quote doubled inside, {...} (ODBC) with '}' doubled inside, or
// up to the next ';' or the end of the line (or of the enclosing quote).
// It returns the span to replace and the decoded value.
func connectionValue(s string, v int, enclose byte) (int, int, string) {
	if v >= len(s) {
		return v, v, ""
	}
	switch q := s[v]; q {
	case '"', '\'', '{':
		closeQ := q
		if q == '{' {
			closeQ = '}'
		}
		for k := v + 1; k < len(s) && k-v < maxQuoteScan && s[k] != '\n'; k++ {
			if s[k] != closeQ {
				continue
			}
			if k+1 < len(s) && s[k+1] == closeQ {
				k++
				continue
			}
			inner := s[v+1 : k]
			return v + 1, k, strings.ReplaceAll(inner, string([]byte{closeQ, closeQ}), string(closeQ))
		}
	}
	e, shellQuote := v, false
	for e < len(s) && s[e] != ';' && s[e] != '\n' && s[e] != '\r' {
		if enclose == '\'' && strings.HasPrefix(s[e:], shellEscapedQuote) {
			e, shellQuote = e+len(shellEscapedQuote), true // a quote inside the shell's '...'
			continue
		}
		if enclose != 0 && s[e] == enclose {
			break
		}
		if enclose == '"' && s[e] == '\\' {
			e++
		}
		e++
	}
	e = min(e, len(s))
	for e > v && (s[e-1] == ' ' || s[e-1] == '\t') {
		e--
	}
	if shellQuote {
		return v, e, strings.ReplaceAll(s[v:e], shellEscapedQuote, "'")
	}
	return v, e, s[v:e]
}

// shellEscapedQuote is how a shell's single-quoted word holds a quote:
// close the quote, an escaped quote, open it again.
const shellEscapedQuote = `'\''`

// nextPairAt reports whether a connection-string pair (Name=) starts at
// s[i] (after blanks).
func nextPairAt(s string, i int) bool {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	b := i
	for i < len(s) && i-b <= maxNameBytes && (nameByte[s[i]] || s[i] == ' ') {
		i++
	}
	return i > b && i < len(s) && s[i] == '=' && isAlnum(s[b])
}

// quotedAt reads a double-quoted string opening at s[v] at the given
// nesting level (level 2: \"...\" inside a JSON string). It returns the
// content span; ok is false when the opening quote is not there or no
// closing quote follows.
func quotedAt(s string, v, level int) (int, int, bool) {
	bs := (1 << (level - 1)) - 1
	if v+bs >= len(s) || s[v+bs] != '"' || strings.Count(s[v:v+bs], `\`) != bs {
		return 0, 0, false
	}
	cs := v + bs + 1
	mod := 1 << level
	for k := cs; k < len(s) && k-cs < maxQuoteScan; k++ {
		if s[k] == '"' && backslashesBefore(s, k)%mod == bs {
			return cs, k - bs, true
		}
	}
	return 0, 0, false
}

// singleQuoted reads '...' at s[v], where a doubled quote stands for one
// (YAML).
func singleQuoted(s string, v int) (int, int, bool) {
	for k := v + 1; k < len(s) && k-v < maxQuoteScan; k++ {
		if s[k] != '\'' {
			continue
		}
		if k+1 < len(s) && s[k+1] == '\'' {
			k++
			continue
		}
		return v + 1, k, true
	}
	return 0, 0, false
}

// balanced returns the end of the bracketed value opening at s[v] (past
// its closing bracket), skipping brackets inside quoted strings; the end
// of the line when it does not close.
func balanced(s string, v int) int {
	depth := 0
	for k := v; k < len(s) && k-v < maxQuoteScan; k++ {
		switch s[k] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return k + 1
			}
		case '"':
			for k++; k < len(s) && s[k] != '"'; k++ {
				if s[k] == '\\' {
					k++
				}
			}
		}
	}
	return lineEnd(s, v)
}

// blockIndicator reports whether s[v] starts a YAML block scalar header
// (| or > with optional chomping and indentation indicators, then the
// end of the line or a comment).
func blockIndicator(s string, v int) bool {
	k := v + 1
	for k < len(s) && (s[k] == '+' || s[k] == '-' || ('1' <= s[k] && s[k] <= '9')) {
		k++
	}
	for k < len(s) && (s[k] == ' ' || s[k] == '\t') {
		k++
	}
	return k == len(s) || s[k] == '\n' || s[k] == '\r' || s[k] == '#'
}

// blockScalar redacts a YAML block scalar (key: | followed by lines
// indented deeper than the key). A key with nothing after it opens a
// nested mapping or sequence: its entries are redacted by their own names,
// not here.
func (r *Redactor) blockScalar(s string, pr *pair, v int, out []found) []found {
	if v >= len(s) || (s[v] != '|' && s[v] != '>') {
		return out
	}
	ls, _ := lineStartWithin(s, pr.nameStart, maxLineScan)
	indent := 0
	for ls+indent < len(s) && (s[ls+indent] == ' ' || s[ls+indent] == '-') {
		indent++
	}
	k := lineEnd(s, v)
	start, end := -1, -1
	for k < len(s) {
		k++ // past the newline
		if k < len(s) && s[k-1] == '\r' && s[k] == '\n' {
			k++
		}
		le := lineEnd(s, k)
		n := 0
		for k+n < le && (s[k+n] == ' ' || s[k+n] == '\t') {
			n++
		}
		if k+n == le { // blank line
			k = le
			continue
		}
		if n <= indent {
			break
		}
		if start < 0 {
			start = k + n
		}
		end = le
		k = le
	}
	if start >= 0 && end > start {
		out = append(out, found{start: start, end: end, rule: RuleSecretAssignment, secret: s[start:end]})
	}
	return out
}

// skipAuthScheme returns where the credentials of an Authorization header
// value begin: after its scheme word (Bearer, Basic, ...).
func skipAuthScheme(s, name string, v, e int) int {
	if !strings.Contains(normalizeName(name), "authorization") {
		return v
	}
	k := v
	for k < e && (isAlnum(s[k]) || s[k] == '-') {
		k++
	}
	if k == v || k >= e || (s[k] != ' ' && s[k] != '\t') || !authSchemes[strings.ToLower(s[v:k])] {
		return v
	}
	for k < e && (s[k] == ' ' || s[k] == '\t') {
		k++
	}
	return k
}

// authSchemes are HTTP authentication schemes (IANA registry and common
// vendor ones); the scheme stays visible, the credentials do not.
var authSchemes = map[string]bool{
	"bearer": true, "basic": true, "token": true, "digest": true, "negotiate": true, "ntlm": true,
	"apikey": true, "api-key": true, "sso-key": true, "hmac": true, "aws4-hmac-sha256": true,
	"dpop": true, "mac": true, "hoba": true, "mutual": true, "vapid": true, "gnap": true,
	"privatetoken": true, "signature": true, "otp": true, "key": true,
}

// placeholder reports whether a value is a stand-in rather than a secret:
// a plain variable reference in braces (${DB_PASSWORD}), a template
// ({{ .Values.db.password }}), a null or empty marker, a type name, a mask
// (****, xxxx) or a redaction marker. The shapes are narrow on purpose: a
// random password is never one of them in practice.
func placeholder(v string) bool {
	v = strings.TrimSpace(v)
	switch {
	case v == "":
		return true
	case (v[0] == '$' || v[0] == '{' || v[0] == '[') && placeholderShape.MatchString(v):
		return true
	case strings.Trim(v, "*") == "" || len(v) >= 3 && strings.Trim(v, "xX") == "":
		return true
	}
	return placeholderWords[strings.ToLower(v)]
}

// placeholderShape matches ${NAME}, {{ template }} and [REDACTED:...].
var placeholderShape = regexp.MustCompile(`^(?:\$\{[A-Za-z_][A-Za-z0-9_]*\}|\{\{ ?[A-Za-z0-9_. |-]+ ?\}\}|\[REDACTED:[a-z0-9+-]+:[0-9a-f]{12}\])$`)

var placeholderWords = map[string]bool{
	"null": true, "nil": true, "none": true, "undefined": true, "true": true, "false": true,
	"required": true, "optional": true, "empty": true, "redacted": true, "string": true,
	"str": true, "bytes": true, "number": true, "int": true, "boolean": true, "bool": true,
	"any": true, "unknown": true, `""`: true, `''`: true,
}

// scanQuotes follows the quoting of a line (starting at ls) from k to p,
// from the state (q open since at), and returns the state at p and where
// it stopped (p, or one past it after an escape).
func scanQuotes(s string, ls, k, p int, q byte, at int) (byte, int, int) {
	for ; k < p; k++ {
		c := s[k]
		switch q {
		case 0:
			switch c {
			case '"', '`':
				q, at = c, k
			case '\'':
				// An apostrophe (don't, it's) opens nothing.
				if k == ls || !isAlnum(s[k-1]) {
					q, at = c, k
				}
			case '\\':
				k++
			}
		case '"':
			switch c {
			case '\\':
				k++
			case '"':
				q = 0
			}
		default:
			if c == q {
				q = 0
			}
		}
	}
	if q == 0 {
		at = -1
	}
	return q, at, k
}

// inEscapedStrings reads again the double-quoted strings of s that hold a
// finding of out[n:] and escape something (a connection string inside a
// JSON document inside text: Password=\"a;b\"): decoded, such a string
// is scanned as text of its own, and what it holds is mapped back.
func (r *Redactor) inEscapedStrings(s string, out []found, n, depth int) []found {
	end := len(out)
	var ps pairScan
	seen := map[int]bool{}
	for i := n; i < end; i++ {
		if ps.enclosing(s, out[i].start) != '"' {
			continue
		}
		qs := ps.quote.at
		if seen[qs] {
			continue
		}
		seen[qs] = true
		qe := closingQuote(s, qs+1, lineEndWithin(s, qs+1, maxQuoteScan), '"')
		if qe < 0 || strings.IndexByte(s[qs+1:qe], '\\') < 0 {
			continue
		}
		out = r.inWord(jsonStringWord(s, qs+1, qe), out, depth+1)
	}
	return out
}

// jsonStringWord decodes the JSON string content s[a:b], keeping where
// each decoded byte came from.
func jsonStringWord(s string, a, b int) *wordText {
	w := &wordText{start: a, end: b, quoted: true}
	for k := a; k < b; k++ {
		if s[k] != '\\' || k+1 >= b {
			w.add(s[k], k, k+1)
			continue
		}
		var c byte
		switch s[k+1] {
		case 'n':
			c = '\n'
		case 't':
			c = '\t'
		case 'r':
			c = '\r'
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'u':
			if k+5 < b {
				if rn := jsonkit.Hex4(s, k+2); rn >= 0 {
					for _, x := range []byte(string(rn)) {
						w.add(x, k, k+6)
					}
					k += 5
					continue
				}
			}
			c = 'u'
		default:
			c = s[k+1]
		}
		w.add(c, k, k+2)
		k++
	}
	return w
}

// closingQuote returns the index in s[v:e] of the quote q that closes the
// enclosing string (a '"' not escaped by a backslash), or -1.
func closingQuote(s string, v, e int, q byte) int {
	for k := v; k < e; k++ {
		switch {
		case s[k] == '\\' && q == '"':
			k++
		case s[k] == q:
			return k
		}
	}
	return -1
}

// flowContext reports whether the name at p sits in a YAML or JSON flow
// collection ({a: 1, b: 2}): after '{' or ',' on its line.
func flowContext(s string, p int) bool {
	for k := p - 1; k >= 0 && p-k < maxLineScan; k-- {
		switch s[k] {
		case ' ', '\t':
			continue
		case '{', ',':
			return true
		}
		return false
	}
	return false
}

// lineStartAssignment reports whether the name at p starts its line
// (after blanks, "export ", or a YAML list dash).
func lineStartAssignment(s string, p int, ps *pairScan) bool {
	ls, ok := ps.lineStart(s, p)
	if !ok {
		return false
	}
	prefix := strings.TrimLeft(s[ls:p], " \t")
	prefix = strings.TrimPrefix(prefix, "export ")
	prefix = strings.TrimPrefix(prefix, "- ")
	return strings.TrimLeft(prefix, " \t") == ""
}

// dashItem reports whether the name at p follows a YAML list dash.
func dashItem(s string, p int, ps *pairScan) bool {
	ls, ok := ps.lineStart(s, p)
	if !ok {
		return false
	}
	return strings.HasPrefix(strings.TrimLeft(s[ls:p], " \t"), "- ")
}

// envFileLike reports whether s reads as an env file: at least two
// assignment lines and nothing else but blank lines and comments.
func envFileLike(s string) bool {
	n := 0
	for len(s) > 0 {
		line := s
		if k := strings.IndexByte(s, '\n'); k >= 0 {
			line, s = s[:k], s[k+1:]
		} else {
			s = ""
		}
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k := 0
		for k < len(line) && (isAlnum(line[k]) || line[k] == '_' || line[k] == '.') {
			k++
		}
		if k == 0 || k >= len(line) || line[k] != '=' {
			return false
		}
		n++
	}
	return n >= 2
}

// cutComment returns where a value in s[v:e] ends before a " #"
// comment (YAML, env files), or also a " ;" one (INI).
func cutComment(s string, v, e int, ini bool) int {
	for k := v + 1; k < e; k++ {
		if (s[k] == '#' || ini && s[k] == ';') && (s[k-1] == ' ' || s[k-1] == '\t') {
			return k
		}
	}
	return e
}

// lineStart returns the index of the first byte of the line holding s[p].
func lineStart(s string, p int) int {
	return strings.LastIndexByte(s[:p], '\n') + 1
}

// lineStartWithin is lineStart looking back at most limit bytes; ok is
// false when the line starts farther back.
func lineStartWithin(s string, p, limit int) (int, bool) {
	lo := max(0, p-limit)
	k := strings.LastIndexByte(s[lo:p], '\n')
	switch {
	case k >= 0:
		return lo + k + 1, true
	case lo == 0:
		return 0, true
	}
	return lo, false
}

// lineEndWithin is lineEnd looking at most limit bytes ahead.
func lineEndWithin(s string, p, limit int) int {
	return lineEnd(s[:min(len(s), p+limit)], p)
}

// lineEnd returns the index of the '\n' or '\r' ending the line holding
// s[p], or len(s).
func lineEnd(s string, p int) int {
	for k := p; k < len(s); k++ {
		if s[k] == '\n' || s[k] == '\r' {
			return k
		}
	}
	return len(s)
}

// indexAnyOr returns the index of the first byte of s in chars, or def.
func indexAnyOr(s, chars string, def int) int {
	if k := strings.IndexAny(s, chars); k >= 0 {
		return k
	}
	return def
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// unescapeLevels decodes a string written inside `levels` levels of
// JSON-style double quotes.
func unescapeLevels(s string, levels int) string {
	for ; levels > 0; levels-- {
		s = unescapeJSON(s)
	}
	return s
}

// unescapeJSON decodes the backslash escapes of a JSON (or YAML
// double-quoted) string; an escape it does not know keeps its character.
func unescapeJSON(s string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			sb.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 'n':
			sb.WriteByte('\n')
		case 't':
			sb.WriteByte('\t')
		case 'r':
			sb.WriteByte('\r')
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'u':
			if i+4 < len(s) {
				if r := jsonkit.Hex4(s, i+1); r >= 0 {
					sb.WriteRune(r)
					i += 4
					continue
				}
			}
			sb.WriteByte('u')
		default:
			sb.WriteByte(s[i])
		}
	}
	return sb.String()
}
