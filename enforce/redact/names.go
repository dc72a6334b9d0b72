package redact

import (
	"fmt"
	"slices"
	"strings"
	"unsafe"
)

// Secret names. One classifier decides, everywhere a value sits under a
// name, whether that name says the value is a secret: a JSON member, a
// KEY=value or key: value pair inside text, a command-line flag, a
// connection-string keyword, a URL query parameter, an HTTP header line.
//
// Names are compared normalized: ASCII letters lowercased, every other
// ASCII character that is not a letter or digit dropped ("X-Api-Key",
// "x_api_key" and "xApiKey" are all "xapikey").

// DefaultFieldNames are the secret names in use when Config.FieldNames is
// nil. An entry is an exact name or a pattern in which '*' stands for any
// run of characters and '?' for one ("*pass*" matches "ADMIN_PASS" and
// "db-password"; "*?key*" matches "api_key" and "AccountKey" but not a
// bare "key", which names lookup keys more often than credentials). A
// pattern match can be undone by DefaultNotSecretWords and
// DefaultNameQualifiers; an exact entry cannot.
// New copies the list; changing this variable affects only Redactors built
// afterwards.
var DefaultFieldNames = []string{
	"*pass*", "*pwd*", "*secret*", "*token*", "*credential*", "*creds*", "*?key*",
	"*auth", "auth", "*authorization*", "*cookie*",
	"otp", "sharedaccesssignature",
	// A qualifier would undo this one, but a Vault AppRole secret_id is
	// a credential.
	"secretid",
}

// DefaultNotSecretWords are words that contain a secret pattern without
// naming a secret: they are removed from a name before the patterns are
// tried, so "keyboard_layout" and "max_tokens" name no secret while
// "keystore_password" still does. Plural "tokens" is here because agent
// payloads use it for counts (max_tokens, input_tokens).
var DefaultNotSecretWords = []string{
	"publickey", "pubkey", "primarykey", "foreignkey", "uniquekey", "compositekey", "sortkey",
	"partitionkey", "rangekey", "hashkey", "routingkey", "cachekey", "objectkey", "lookupkey",
	"groupkey", "mapkey", "indexkey", "idempotencykey", "dedupkey", "dedupekey",
	"deduplicationkey", "keyboard", "keyword", "keystroke", "keypress", "keydown", "keyup",
	"keyframe", "keypad", "keynote", "keyspace", "keycloak", "keystore", "keyring", "keychain",
	"keyvault", "keyserver", "keymap", "keybind", "keyless", "hotkey", "monkey", "donkey",
	"turkey", "hockey", "jockey", "whiskey", "turnkey",
	"tokens", "tokeniz", "pagetoken", "nexttoken", "continuationtoken", "cursortoken",
	"synctoken", "resumetoken", "paginationtoken", "pagingtoken",
	"bypass", "compass", "passthrough", "passthru", "passive", "passenger", "passport",
	"passage", "passed", "passes", "passing", "passrate", "surpass", "overpass", "underpass",
	"trespass", "secretary", "oauth", "oldpwd",
}

// DefaultNameQualifiers are last words that make a secret-sounding name
// describe the secret instead of holding it: "password_file",
// "token_url", "secret_name", "key_id", "token_type". A qualifier of
// three letters or fewer counts only as a separate word ("key_id",
// "KeyId"); a longer one also at the end of a run-together name
// ("passwordfile").
var DefaultNameQualifiers = []string{
	"file", "files", "filename", "path", "paths", "dir", "directory", "folder",
	"url", "uri", "urls", "endpoint", "host", "name", "names", "id", "ids", "arn",
	"type", "kind", "size", "length", "len", "count", "limit", "ttl", "expiry",
	"expires", "expiresin", "expiresat", "expiration", "lifetime", "timeout", "format",
	"encoding", "alg", "algorithm", "version", "stdin", "env", "var", "variable",
	"prompt", "policy", "hint", "field", "header", "ref", "reference", "provider",
	"helper", "process", "source", "store", "manager", "method", "mode", "label",
	"description", "enabled", "required", "exists", "rotation", "at", "date", "created",
	"updated", "changed", "reset", "scope", "scopes", "usage", "used", "pattern",
	"regex", "prefix", "suffix", "fingerprint", "location", "command", "cmd", "strength",
	"validator", "validation", "index", "idx", "offset", "bits", "curve",
}

// queryExtraNames are URL query parameters that carry a credential
// without naming one: a Shared Access Signature's sig, a presigned URL's
// signature, and the bare key= many APIs take.
var queryExtraNames = map[string]bool{"sig": true, "signature": true, "key": true, "apikey": true}

// connectionStringNames are the connection-string keywords holding
// secrets that the name patterns alone might miss.
var connectionStringNames = map[string]bool{"pwd": true, "password": true, "accountkey": true,
	"sharedaccesskey": true, "sharedaccesssignature": true}

// maxNameBytes bounds the names the classifier looks at; longer ones are
// not names (a name of 64 characters is already unusual).
const maxNameBytes = 96

// glob is one name pattern: '*' stands for any run of characters, '?'
// for exactly one.
type glob string

// match reports whether the normalized name n matches the pattern.
func (g glob) match(n string) bool {
	p := string(g)
	px, nx := 0, 0
	starPx, starNx := -1, -1
	for px < len(p) || nx < len(n) {
		if px < len(p) {
			switch c := p[px]; c {
			case '*':
				starPx, starNx = px, nx+1
				px++
				continue
			case '?':
				if nx < len(n) {
					px++
					nx++
					continue
				}
			default:
				if nx < len(n) && n[nx] == c {
					px++
					nx++
					continue
				}
			}
		}
		if starPx >= 0 && starNx <= len(n) {
			px, nx = starPx+1, starNx
			starNx++
			continue
		}
		return false
	}
	return true
}

// pieces returns the literal runs of the pattern.
func (g glob) pieces() []string {
	return strings.FieldsFunc(string(g), func(r rune) bool { return r == '*' || r == '?' })
}

// names is a compiled secret-name classifier. It is immutable.
type names struct {
	exact      map[string]struct{}
	patterns   []glob
	notSecret  []string
	qualifiers map[string]bool // normalized last words
	longQuals  []string        // qualifiers of four letters or more
	// needles holds, for each pattern, a piece every match contains (its
	// longest), indexed by first byte: a name holding none of them matches
	// no pattern, which is most names, found in one pass.
	needles [256][]string
	first   [256]bool // first bytes of needles
	any     bool      // a pattern without pieces ("*") matches every name
	// exactLens marks the lengths of the exact names.
	exactLens [maxNameBytes + 1]bool
}

func newNames(secret, notSecret, qualifiers []string) (*names, error) {
	n := &names{exact: map[string]struct{}{}, qualifiers: map[string]bool{}}
	for _, s := range secret {
		norm := normalizeGlob(s)
		if strings.Trim(norm, "*?") == "" {
			return nil, fmt.Errorf("redact: field name %q has no letter or digit", s)
		}
		if !strings.ContainsAny(norm, "*?") {
			n.exact[norm] = struct{}{}
			if len(norm) <= maxNameBytes {
				n.exactLens[len(norm)] = true
			}
			continue
		}
		g := glob(norm)
		n.patterns = append(n.patterns, g)
		parts := g.pieces()
		if len(parts) == 0 {
			n.any = true
			continue
		}
		longest := parts[0]
		for _, p := range parts[1:] {
			if len(p) > len(longest) {
				longest = p
			}
		}
		if !slices.Contains(n.needles[longest[0]], longest) {
			n.needles[longest[0]] = append(n.needles[longest[0]], longest)
			n.first[longest[0]] = true
		}
	}
	for _, s := range notSecret {
		if norm := normalizeName(s); norm != "" {
			n.notSecret = append(n.notSecret, norm)
		}
	}
	for _, s := range qualifiers {
		norm := normalizeName(s)
		if norm == "" {
			continue
		}
		n.qualifiers[norm] = true
		if len(norm) >= 4 {
			n.longQuals = append(n.longQuals, norm)
		}
	}
	return n, nil
}

// secret reports whether name names a secret.
func (n *names) secret(name string) bool {
	if len(name) == 0 || len(name) > maxNameBytes {
		return false
	}
	var buf [maxNameBytes]byte
	norm := appendNormalized(buf[:0], name)
	if len(norm) == 0 {
		return false
	}
	if n.exactLens[len(norm)] {
		if _, ok := n.exact[string(norm)]; ok {
			return true
		}
	}
	if !n.matchPatterns(norm) {
		return false
	}
	// A pattern matched: undo it for words that only look like secrets,
	// then for names that describe a secret rather than hold one.
	if len(n.notSecret) > 0 {
		var buf2 [maxNameBytes]byte
		stripped := removeWords(buf2[:0], norm, n.notSecret)
		if len(stripped) != len(norm) && !n.matchPatterns(stripped) {
			return false
		}
	}
	return !n.qualified(name, norm)
}

func (n *names) matchPatterns(norm []byte) bool {
	s := bytesView(norm)
	if !n.any && !n.mayMatch(s) {
		return false
	}
	for i := range n.patterns {
		if n.patterns[i].match(s) {
			return true
		}
	}
	return false
}

// mayMatch reports whether s contains a needle of some pattern.
func (n *names) mayMatch(s string) bool {
	for i := 0; i < len(s); i++ {
		if !n.first[s[i]] {
			continue
		}
		for _, nd := range n.needles[s[i]] {
			if strings.HasPrefix(s[i:], nd) {
				return true
			}
		}
	}
	return false
}

// qualified reports whether the name ends in a qualifier: as its own last
// word (split at non-alphanumerics and lower-to-upper case changes), or,
// for a long qualifier, at the end of the normalized name.
func (n *names) qualified(raw string, norm []byte) bool {
	if w, ok := lastWord(raw); ok {
		var buf [maxNameBytes]byte
		if n.qualifiers[bytesView(appendNormalized(buf[:0], w))] {
			return true
		}
	}
	s := strings.TrimRight(bytesView(norm), "0123456789")
	for _, q := range n.longQuals {
		if len(s) > len(q) && strings.HasSuffix(s, q) {
			return true
		}
	}
	return false
}

// lastWord returns the last word of a name, split at non-alphanumerics and
// where a lowercase letter meets an uppercase one, passing over a trailing
// number ("token_count_2" ends in "count"); ok is false when the name is a
// single word.
func lastWord(raw string) (string, bool) {
	end := len(raw)
	for end > 0 && (!isAlnum(raw[end-1]) || '0' <= raw[end-1] && raw[end-1] <= '9') {
		end--
	}
	start := end
	for start > 0 && isAlnum(raw[start-1]) {
		if start < end && isUpper(raw[start]) && isLower(raw[start-1]) {
			break
		}
		start--
	}
	for i := 0; i < start; i++ {
		if isAlnum(raw[i]) {
			return raw[start:end], start < end
		}
	}
	return "", false
}

// removeWords appends norm to dst with every occurrence of each word
// removed.
func removeWords(dst, norm []byte, words []string) []byte {
	s := bytesView(norm)
	for i := 0; i < len(s); {
		skipped := false
		for _, w := range words {
			if strings.HasPrefix(s[i:], w) {
				i += len(w)
				skipped = true
				break
			}
		}
		if !skipped {
			dst = append(dst, s[i])
			i++
		}
	}
	return dst
}

// normalizeGlob normalizes a name pattern, keeping its '*'s and '?'s.
func normalizeGlob(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '*' || c == '?':
			sb.WriteByte(c)
		default:
			sb.Write(appendNormalized(nil, s[i:i+1]))
		}
	}
	return sb.String()
}

// normalizeName lowercases ASCII letters and drops every other ASCII byte
// that is not a letter or digit; non-ASCII bytes are kept.
func normalizeName(s string) string { return string(appendNormalized(nil, s)) }

func appendNormalized(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c >= 0x80:
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		default:
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

func isAlnum(c byte) bool { return isLower(c) || isUpper(c) || '0' <= c && c <= '9' }
func isLower(c byte) bool { return 'a' <= c && c <= 'z' }
func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }

// bytesView returns b as a string without copying. The caller must not
// change b while the string is in use; every use here is a lookup that
// ends before b is touched again.
func bytesView(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
