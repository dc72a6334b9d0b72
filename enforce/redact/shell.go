package redact

import (
	"path"
	"slices"
	"sort"
	"strings"
	"sync"

	"mvdan.cc/sh/v3/syntax"

	"github.com/talos-audit/talos/schemas/jsonkit"
)

// Secrets after command-line flags. Text holding a candidate flag (a
// secret-named --flag or -flag, or a password flag of a command that has
// one, such as mysql's -p) is read as shell words with mvdan.cc/sh, a
// maintained shell parser, so a value is exactly the word the shell would
// pass: quoted, escaped, concatenated, spanning lines. Quoted words are
// scanned again as text of their own (sh -c "...", curl -d '{...}',
// psql "postgres://..."), and so is text in which the pair scanner found
// a secret behind quoting, so that its value is the one the shell would
// see. Text the parser rejects (prose with an apostrophe, half a command)
// is read line by line, and a line it still rejects is split into words
// by the same quoting rules without the grammar. An argument array
// (["mysql", "-psecret"]) is read the same way, one word per element.

// cmdFlag is a password flag of one command.
type cmdFlag struct {
	flag     string // "-p", "--user"
	attached bool   // the value may follow the flag in the same word: -pVALUE
	separate bool   // the value may be the next word: -p VALUE
	userPass byte   // the value is user<sep>password; only the password is secret
	after    string // the subcommand that must come first ("login")
}

// commandFlags lists the commands whose password flags do not say
// "password". Flags whose names do (--password, --client-secret,
// --api-key, --token, -passin) need no entry.
var commandFlags = func() map[string][]cmdFlag {
	m := map[string][]cmdFlag{}
	add := func(names string, flags ...cmdFlag) {
		for _, n := range strings.Fields(names) {
			m[n] = append(m[n], flags...)
		}
	}
	// -p alone prompts; only an attached value is a password.
	add("mysql mysqldump mysqladmin mysqlimport mysqlshow mysqlcheck mysqlpump mysqlbinlog mysqlsh "+
		"mariadb mariadb-dump mariadb-admin mariadb-import mariadb-show mariadb-check 7z 7za 7zr",
		cmdFlag{flag: "-p", attached: true})
	add("sshpass", cmdFlag{flag: "-p", attached: true, separate: true})
	add("redis-cli", cmdFlag{flag: "-a", attached: true, separate: true})
	add("sqlcmd bcp osql isql", cmdFlag{flag: "-P", attached: true, separate: true})
	add("mongo mongosh mongodump mongorestore mongoexport mongoimport mongostat mongotop mongofiles",
		cmdFlag{flag: "-p", separate: true})
	add("ldapsearch ldapadd ldapmodify ldapdelete ldapwhoami ldappasswd ldapcompare ldapmodrdn ldapexop",
		cmdFlag{flag: "-w", attached: true, separate: true})
	add("zip unzip zipcloak", cmdFlag{flag: "-P", separate: true})
	add("openssl", cmdFlag{flag: "-k", separate: true})
	add("curl",
		cmdFlag{flag: "-u", attached: true, separate: true, userPass: ':'},
		cmdFlag{flag: "--user", separate: true, userPass: ':'},
		cmdFlag{flag: "-U", attached: true, separate: true, userPass: ':'},
		cmdFlag{flag: "--proxy-user", separate: true, userPass: ':'})
	add("smbclient rpcclient", cmdFlag{flag: "-U", attached: true, separate: true, userPass: '%'},
		cmdFlag{flag: "--user", separate: true, userPass: '%'})
	add("docker podman nerdctl buildah skopeo oras helm crane az cf oc",
		cmdFlag{flag: "-p", separate: true, attached: true, after: "login"})
	add("gh", cmdFlag{flag: "--body", separate: true, after: "secret"},
		cmdFlag{flag: "-b", separate: true, attached: true, after: "secret"})
	return m
}()

// commandNames are the keys of commandFlags, for the text prefilter.
var commandNames = func() []string {
	out := make([]string, 0, len(commandFlags))
	for n := range commandFlags {
		out = append(out, n)
	}
	return out
}()

// shortFlagLetters are the letters of commandFlags' single-letter flags.
var shortFlagLetters = func() (set [256]bool) {
	for _, fs := range commandFlags {
		for _, f := range fs {
			if len(f.flag) == 2 {
				set[f.flag[1]] = true
			}
		}
	}
	return set
}()

// notValueFlagPrefixes are flag name openings that make a secret-named
// flag a switch: --no-password, --ask-pass, --prompt-token.
var notValueFlagPrefixes = []string{"no", "skip", "ask", "prompt", "without", "disable", "show", "print"}

// maxShellDepth bounds how many quoted commands inside words are read.
const maxShellDepth = 3

// maxHintScan bounds how far before a flag its command is looked for
// when the line is not a program.
const maxHintScan = 512

// wordText is a shell word as the shell reads it: lit are its bytes after
// quote removal and escapes, and lit[i] came from s[src[i][0]:src[i][1]]
// of the text. end is where the word ends in the text.
type wordText struct {
	lit   []byte
	src   [][2]int32
	start int
	end   int
	// quoted is set when some of the word was quoted or escaped (its
	// literal is not a plain slice of the text).
	quoted bool
}

func (w *wordText) add(b byte, start, end int) {
	w.lit = append(w.lit, b)
	w.src = append(w.src, [2]int32{int32(start), int32(end)})
}

// span returns the text span of the whole literal.
func (w *wordText) span() (int, int) { return w.spanFrom(0) }

// spanFrom returns the text span of lit[k:].
func (w *wordText) spanFrom(k int) (int, int) {
	if k >= len(w.lit) {
		return w.end, w.end
	}
	return int(w.src[k][0]), int(w.src[len(w.src)-1][1])
}

// spanOf returns the text span of lit[a:b].
func (w *wordText) spanOf(a, b int) (int, int) {
	return int(w.src[a][0]), int(w.src[b-1][1])
}

// readShellWord reads the shell word starting at s[i]: it ends at
// unquoted whitespace, or, inside an enclosing quoted string (enclose is
// its quote), at that string's closing quote. A quote that does not close
// runs to the end of the line.
func readShellWord(s string, i int, enclose byte) *wordText {
	if enclose != 0 {
		return readEnclosedWord(s, i, enclose)
	}
	w := &wordText{start: i}
	k := i
loop:
	for k < len(s) {
		c := s[k]
		switch c {
		case ' ', '\t', '\n', '\r':
			break loop
		case '\\':
			w.quoted = true
			switch {
			case k+1 == len(s):
				w.add(c, k, k+1)
				k++
			case s[k+1] == '\n':
				k += 2
			default:
				w.add(s[k+1], k, k+2)
				k += 2
			}
		case '\'':
			w.quoted = true
			e := strings.IndexByte(s[k+1:], '\'')
			if e < 0 {
				le := lineEnd(s, k)
				for j := k + 1; j < le; j++ {
					w.add(s[j], j, j+1)
				}
				k = le
				break loop
			}
			for j := k + 1; j < k+1+e; j++ {
				w.add(s[j], j, j+1)
			}
			k += e + 2
		case '"':
			w.quoted = true
			j, closed := w.addDoubleQuoted(s, k)
			if !closed {
				le := lineEnd(s, k)
				w.lit, w.src = w.lit[:0], w.src[:0]
				for j := w.start; j < le; j++ {
					w.add(s[j], j, j+1)
				}
				k = le
				break loop
			}
			k = j + 1
		default:
			w.add(c, k, k+1)
			k++
		}
	}
	w.end = k
	return w
}

// readEnclosedWord is readShellWord inside a string quoted with enclose:
// the word runs to the closing quote, and inside double quotes a
// backslash escapes the byte after it.
func readEnclosedWord(s string, i int, enclose byte) *wordText {
	w := &wordText{start: i}
	k := i
	for k < len(s) {
		c := s[k]
		if c == enclose {
			break
		}
		if enclose == '"' && c == '\\' && k+1 < len(s) {
			w.add(s[k+1], k, k+2)
			w.quoted = true
			k += 2
			continue
		}
		w.add(c, k, k+1)
		k++
	}
	w.end = k
	return w
}

// addDoubleQuoted adds the contents of the double-quoted string that
// opens at s[k], unescaping what a backslash escapes there. It returns the
// offset of the closing quote, and closed false when none comes within
// maxQuoteScan bytes.
func (w *wordText) addDoubleQuoted(s string, k int) (int, bool) {
	j := k + 1
	for j < len(s) && j-k < maxQuoteScan {
		if s[j] == '"' {
			return j, true
		}
		if s[j] == '\\' && j+1 < len(s) && strings.IndexByte("\"\\$`\n", s[j+1]) >= 0 {
			if s[j+1] != '\n' {
				w.add(s[j+1], j, j+2)
			}
			j += 2
			continue
		}
		w.add(s[j], j, j+1)
		j++
	}
	return j, false
}

// flagValue is the value of a secret flag: lit[skip:] of word index word.
type flagValue struct {
	word, skip int
}

// flagValues finds the secret flag values in one command's words (given
// as their literals). hint names the command when the words do not (an
// argument array whose command is a sibling member).
//
// After a word "config" or "configure" (or with configMode set), a
// secret-named word is a setting and the word after it its value (git
// config github.token VALUE, aws configure set aws_secret_access_key
// VALUE).
func (r *Redactor) flagValues(lits []string, hint string, configMode bool, dst []flagValue) []flagValue {
	var flags []cmdFlag
	if hint != "" {
		flags = commandFlags[commandName(hint)]
	}
	var seen []string
	for i := 0; i < len(lits); i++ {
		lit := lits[i]
		// A flag is never a command, whatever its value looks like
		// (-pXXX/az is mysql's password, not the az command).
		if lit == "" || lit[0] != '-' {
			if cf, ok := commandFlags[commandName(lit)]; ok {
				flags, seen = cf, seen[:0]
				continue
			}
		}
		if lit == "" || lit[0] != '-' || len(lit) < 2 {
			if lit == "config" || lit == "configure" {
				configMode = true
			}
			// git config github.token VALUE, aws configure set NAME VALUE
			if configMode && i+1 < len(lits) && len(lit) > 2 && r.names.secret(lit) {
				dst = append(dst, flagValue{word: i + 1})
				i++
				continue
			}
			if len(seen) < 8 {
				seen = append(seen, lit)
			}
			continue
		}
		if lit == "--" {
			continue
		}
		if v, ok := commandFlagValue(flags, seen, lits, i); ok {
			dst = append(dst, v)
			if v.word > i {
				i = v.word
			}
			continue
		}
		dashes := 1
		if lit[1] == '-' {
			dashes = 2
		}
		name, _, hasEq := strings.Cut(lit[dashes:], "=")
		if len(name) < 2 || !flagName(name) || !r.secretFlagName(name) {
			continue
		}
		switch {
		case hasEq:
			dst = append(dst, flagValue{word: i, skip: dashes + len(name) + 1})
		case i+1 < len(lits):
			dst = append(dst, flagValue{word: i + 1})
			i++
		}
	}
	return dst
}

// flagName reports whether s can be the name of a flag: a letter or
// digit, then letters, digits, '_', '.' and '-'.
func flagName(s string) bool {
	if s == "" || !isAlnum(s[0]) || len(s) > maxNameBytes {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !nameByte[s[i]] {
			return false
		}
	}
	return true
}

// secretFlagName reports whether a flag (without its dashes) takes a
// secret: its name names one and does not make it a switch.
func (r *Redactor) secretFlagName(name string) bool {
	if !r.names.secret(name) {
		return false
	}
	lower := strings.ToLower(name)
	for _, p := range notValueFlagPrefixes {
		if len(lower) > len(p) && strings.HasPrefix(lower, p) && !isAlnum(lower[len(p)]) {
			return false
		}
	}
	return true
}

// commandFlagValue matches lits[i] against the command's password flags.
func commandFlagValue(flags []cmdFlag, seen, lits []string, i int) (flagValue, bool) {
	lit := lits[i]
	for _, f := range flags {
		if f.after != "" && !slices.Contains(seen, f.after) {
			continue
		}
		var v flagValue
		switch {
		case lit == f.flag && f.separate && i+1 < len(lits):
			v = flagValue{word: i + 1}
		case strings.HasPrefix(lit, f.flag+"=") && strings.HasPrefix(f.flag, "--"):
			v = flagValue{word: i, skip: len(f.flag) + 1}
		case f.attached && len(lit) > len(f.flag) && strings.HasPrefix(lit, f.flag):
			v = flagValue{word: i, skip: len(f.flag)}
		default:
			continue
		}
		if f.userPass != 0 {
			val := lits[v.word][v.skip:]
			k := strings.IndexByte(val, f.userPass)
			if k < 0 {
				return flagValue{word: v.word, skip: len(lits[v.word])}, true // no password: it is prompted for
			}
			v.skip += k + 1
		}
		return v, true
	}
	return flagValue{}, false
}

// commandName is the program name of a word: its base name, without
// ".exe".
func commandName(w string) string {
	if w == "" || len(w) > 256 {
		return ""
	}
	return strings.TrimSuffix(path.Base(strings.ReplaceAll(w, `\`, "/")), ".exe")
}

// flagCandidates returns the offsets in s of words that may be secret
// flags: a secret-named flag, or a password flag of commandFlags when one
// of its commands is named in s (the parse then pairs flags with their
// commands).
func (r *Redactor) flagCandidates(s string, dst []int) []int {
	hasCmd := int8(0) // whether a command of commandFlags is named: asked once
	named := func() bool {
		if hasCmd == 0 {
			hasCmd = -1
			for _, n := range commandNames {
				if strings.Contains(s, n) {
					hasCmd = 1
					break
				}
			}
		}
		return hasCmd > 0
	}
	for i := 0; i < len(s); {
		k := strings.IndexByte(s[i:], '-')
		if k < 0 {
			break
		}
		p := i + k
		i = p + 1
		if p > 0 && !flagLead[s[p-1]] {
			continue
		}
		q := p + 1
		if q < len(s) && s[q] == '-' {
			q++
		}
		e := q
		for e < len(s) && e-q < maxNameBytes && nameByte[s[e]] {
			e++
		}
		i = max(i, e)
		switch {
		case e-q >= 2 && isAlnum(s[q]) && r.secretFlagName(s[q:e]):
		case q == p+1 && e > q && shortFlagLetters[s[q]] && named():
		case e-q >= 2 && q == p+2 && strings.Contains("--user --proxy-user --body", s[p:e]) && named():
		default:
			continue
		}
		dst = append(dst, p)
	}
	return r.configCandidates(s, dst)
}

// configCandidates adds the offsets of secret-named settings after a
// word "config" or "configure" on the same line.
func (r *Redactor) configCandidates(s string, dst []int) []int {
	for i := 0; i < len(s); {
		k := strings.Index(s[i:], "config")
		if k < 0 {
			break
		}
		p := i + k
		i = p + len("config")
		e := i
		if strings.HasPrefix(s[e:], "ure") {
			e += 3
		}
		if p > 0 && !flagLead[s[p-1]] || e < len(s) && s[e] != ' ' && s[e] != '\t' {
			continue
		}
		le := lineEndWithin(s, p, maxLineScan)
		for k, n := e, 0; k < le && n < 6; n++ {
			for k < le && (s[k] == ' ' || s[k] == '\t') {
				k++
			}
			w := k
			for k < le && s[k] != ' ' && s[k] != '\t' {
				k++
			}
			if k > w && s[w] != '-' && r.names.secret(s[w:k]) {
				dst = append(dst, w)
				break
			}
		}
	}
	return dst
}

// flagLead marks the bytes that may come right before a flag.
var flagLead = byteSet(" \t\r\n\"'`(;|&")

// shellParsers reuses mvdan.cc/sh parsers (a Parser may be reused, not
// shared).
var shellParsers = sync.Pool{New: func() any { return syntax.NewParser(syntax.Variant(syntax.LangBash)) }}

// shellWords reads s as shell words when it holds a candidate flag, or
// when reread is set (a secret was found in text that quotes or escapes):
// it records the values of secret flags, and scans again, as text of
// their own, the words whose quoting the text scanner could not see
// through (sh -c "...", curl -d '{...}', psql "postgres://..."), mapping
// what it finds there back to s.
func (r *Redactor) shellWords(s string, out []found, depth int, reread bool, lines []int) []found {
	var candBuf [8]int
	cands := r.flagCandidates(s, candBuf[:0])
	if len(cands) == 0 && !reread {
		return out
	}
	explained := make(map[int]bool, len(cands))
	if f, ok := parseShell(s); ok {
		return r.readProgram(s, 0, f, out, explained, depth, cands)
	}
	// Not a program as a whole (prose, half a command): the lines with a
	// candidate or a finding, one by one.
	done := -1
	if !reread {
		lines = nil
	}
	lines = append(lines, cands...)
	sort.Ints(lines)
	for _, c := range lines {
		if c < done {
			continue
		}
		ls, le := lineStart(s, c), lineEnd(s, c)
		done = le
		if f, ok := parseShell(s[ls:le]); ok {
			out = r.readProgram(s, ls, f, out, explained, depth, nil)
		}
	}
	skip := 0
	for _, c := range cands {
		if !explained[c] && c >= skip {
			n := len(out)
			out = r.flagsAt(s, c, out)
			// Flags inside a value just redacted are redacted with it.
			for _, f := range out[n:] {
				skip = max(skip, resumeAt(s, c, f.end))
			}
		}
	}
	return out
}

// parseShell parses s as a bash program.
func parseShell(s string) (*syntax.File, bool) {
	p := shellParsers.Get().(*syntax.Parser)
	defer shellParsers.Put(p)
	f, err := p.Parse(strings.NewReader(s), "")
	return f, err == nil
}

// readProgram reads the commands of a parsed program whose source starts
// at base in s. Candidates (offsets in s) that no argument word begins
// with were not commands' flags after all (a flag inside a quoted word,
// or inside a heredoc): they are read on their own by flagsAt.
func (r *Redactor) readProgram(s string, base int, f *syntax.File, out []found, explained map[int]bool, depth int, cands []int) []found {
	syntax.Walk(f, func(n syntax.Node) bool {
		call, ok := n.(*syntax.CallExpr)
		if !ok {
			return true
		}
		words := make([]*wordText, 0, len(call.Args))
		lits := make([]string, 0, len(call.Args))
		for _, a := range call.Args {
			w := wordFromSyntax(s, base, a)
			words = append(words, w)
			lits = append(lits, string(w.lit))
			if len(w.src) > 0 {
				explained[int(w.src[0][0])] = true
			}
		}
		for _, v := range r.flagValues(lits, "", false, nil) {
			out = emitFlag(out, words[v.word], v.skip)
		}
		if depth < maxShellDepth {
			for _, w := range words {
				// A word written as JSON ({"a":"b"}) is data the text
				// scanner reads as it is; quote removal would garble it.
				if w.quoted && len(w.lit) >= 3 && s[w.start] != '{' && s[w.start] != '[' {
					out = r.inWord(w, out, depth+1)
				}
			}
		}
		return true
	})
	for _, c := range cands {
		if !explained[c] {
			out = r.flagsAt(s, c, out)
		}
	}
	return out
}

// inWord scans a quoted word's literal as text of its own and maps what
// it finds back to the text the word was read from.
func (r *Redactor) inWord(w *wordText, out []found, depth int) []found {
	for _, f := range r.positionalDepth(string(w.lit), nil, depth) {
		if f.end <= f.start || f.end > len(w.src) {
			continue
		}
		a, b := w.spanOf(f.start, f.end)
		out = append(out, found{start: a, end: b, rule: f.rule, secret: f.secret})
	}
	return out
}

// flagsAt reads the candidate flag at s[c] and the words after it on its
// line by the shell's quoting rules, without its grammar (the line is not
// a program: prose with an apostrophe, half a command). The command, for
// a single-letter flag, is a word of commandFlags before it on the line.
func (r *Redactor) flagsAt(s string, c int, out []found) []found {
	ls, _ := lineStartWithin(s, c, maxHintScan)
	le := min(len(s), c+maxQuoteScan) // the words stop at the line's end
	hint, config := "", false
	for k := ls; k < c; {
		for k < c && (s[k] == ' ' || s[k] == '\t') {
			k++
		}
		w := k
		for k < c && s[k] != ' ' && s[k] != '\t' {
			k++
		}
		f := s[w:k]
		if _, ok := commandFlags[commandName(f)]; ok {
			hint = f
		}
		config = config || f == "config" || f == "configure"
	}
	var words []*wordText
	var lits []string
	for k := c; len(words) < 3 && k < le; {
		for k < le && (s[k] == ' ' || s[k] == '\t') {
			k++
		}
		if k >= le || s[k] == '\n' || s[k] == '\r' {
			break
		}
		w := readShellWord(s[:le], k, 0)
		if w.end == k {
			break
		}
		words = append(words, w)
		lits = append(lits, string(w.lit))
		k = w.end
	}
	for _, v := range r.flagValues(lits, hint, config, nil) {
		out = emitFlag(out, words[v.word], v.skip)
	}
	return out
}

// emitFlag records lit[skip:] of w as a flag value.
func emitFlag(out []found, w *wordText, skip int) []found {
	if skip >= len(w.lit) {
		return out
	}
	secret := string(w.lit[skip:])
	if placeholder(secret) {
		return out
	}
	a, b := w.spanFrom(skip)
	return append(out, found{start: a, end: b, rule: RuleSecretFlag, secret: secret})
}

// wordFromSyntax builds the literal of a parsed word, with the text span
// of each byte. Expansions ($VAR, $(cmd)) keep their text: a value the
// shell would compute is redacted as written.
func wordFromSyntax(s string, base int, word *syntax.Word) *wordText {
	w := &wordText{start: base + int(word.Pos().Offset()), end: base + int(word.End().Offset())}
	for _, p := range word.Parts {
		w.addPart(s, base, p, false)
	}
	return w
}

func (w *wordText) addPart(s string, base int, p syntax.WordPart, inDouble bool) {
	switch x := p.(type) {
	case *syntax.Lit:
		a, b := base+int(x.ValuePos.Offset()), base+int(x.ValueEnd.Offset())
		for k := a; k < b && k < len(s); k++ {
			if s[k] != '\\' || k+1 >= b {
				w.add(s[k], k, k+1)
				continue
			}
			n := s[k+1]
			switch {
			case n == '\n':
				w.quoted = true
				k++
			case !inDouble || strings.IndexByte("\"\\$`", n) >= 0:
				w.quoted = true
				w.add(n, k, k+2)
				k++
			default:
				w.add(s[k], k, k+1)
			}
		}
	case *syntax.SglQuoted:
		w.quoted = true
		l, r := base+int(x.Left.Offset()), base+int(x.Right.Offset())
		if x.Dollar {
			w.addANSIC(s, l+2, r)
			return
		}
		for k := l + 1; k < r && k < len(s); k++ {
			w.add(s[k], k, k+1)
		}
	case *syntax.DblQuoted:
		w.quoted = true
		for _, q := range x.Parts {
			w.addPart(s, base, q, true)
		}
	default:
		a, b := base+int(p.Pos().Offset()), base+int(p.End().Offset())
		for k := a; k < b && k < len(s); k++ {
			w.add(s[k], k, k+1)
		}
	}
}

// addANSIC adds the content of $'...' (s[a:b]) with its escapes decoded.
func (w *wordText) addANSIC(s string, a, b int) {
	for k := a; k < b && k < len(s); k++ {
		if s[k] != '\\' || k+1 >= b {
			w.add(s[k], k, k+1)
			continue
		}
		n := s[k+1]
		var c byte
		switch n {
		case 'n':
			c = '\n'
		case 't':
			c = '\t'
		case 'r':
			c = '\r'
		case 'a':
			c = 7
		case 'b':
			c = 8
		case 'e', 'E':
			c = 27
		case 'f':
			c = '\f'
		case 'v':
			c = '\v'
		case 'x':
			if k+3 < b {
				if v, ok := hexByte(s[k+2 : k+4]); ok {
					w.add(v, k, k+4)
					k += 3
					continue
				}
			}
			c = n
		default:
			c = n
		}
		w.add(c, k, k+2)
		k++
	}
}

func hexByte(s string) (byte, bool) {
	r := jsonkit.Hex4("00"+s, 0)
	return byte(r), r >= 0
}
