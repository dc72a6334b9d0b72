package enforce

import (
	"path"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// maxPathBytes bounds a path argument; longer ones are denied unread.
const maxPathBytes = 4096

// PathEscapes reports whether p, a path argument, could resolve outside
// root (an absolute, clean, slash-separated directory: the tool's
// workspace_root). Relative paths are joined to root; absolute paths must
// be inside root. It is the DENY_PATH_TRAVERSAL check of preflight
// (CSP MUST 7, VAL-03) and is deliberately stricter than path resolution:
// it denies anything a tool, a shell, a URL decoder or another operating
// system might read as a way out, even when the path would stay inside
// after cleaning:
//
//   - ".." segments anywhere, and dot-only segments ("...", ". .", ".. ")
//     that Windows trims to "..";
//   - percent-encoded dots, slashes, backslashes, percent signs (double
//     encoding, %252e), control bytes, and encoded invalid or overlong UTF-8
//     (%c0%ae, %c0%af); other escapes are decoded and the result re-checked;
//   - backslashes, NUL, control and invisible format characters, invalid
//     UTF-8;
//   - colons (Windows drive letters "C:", URL schemes "file://", NTFS
//     alternate streams), a leading "//" (network path), "~" at the start of
//     a segment (home expansion), "$" (shell variable expansion);
//   - unicode dot and slash lookalikes (U+FF0E, U+FF0F, U+2024, U+2215,
//     U+2044, …): every non-ASCII rune whose NFKC form holds a dot, slash or
//     other path syntax, plus slash-like runes NFKC leaves alone; the NFKC
//     form of the whole path is re-checked too;
//   - absolute paths outside root, including root-prefix tricks (/work/root2
//     when root is /work/root);
//   - paths through symlink farms: proc/self, proc/<pid>, proc/thread-self,
//     dev/fd, dev/stdin|stdout|stderr, dev/tcp|udp, wherever they appear
//     below root.
//
// An empty p is root itself: inside. The reason is a short fixed phrase that
// never echoes p. PathEscapes does no I/O: it cannot see real symlinks
// inside the workspace, which the tool's sandbox must confine (CSP MUST 8).
func PathEscapes(root, p string) (bool, string) {
	if root == "" || root[0] != '/' || strings.ContainsAny(root, "\\\x00") {
		return true, "workspace root is not an absolute path"
	}
	return pathEscapes(path.Clean(root), p, 0)
}

func pathEscapes(root, p string, depth int) (bool, string) {
	if p == "" {
		return false, ""
	}
	if len(p) > maxPathBytes {
		return true, "path too long"
	}
	// ASCII text is NFKC-normal: only a path with another byte is
	// normalised below.
	ascii, why := characterProblem(p)
	if why != "" {
		return true, why
	}
	if strings.IndexByte(p, '%') >= 0 {
		dec, bad, why := percentDecode(p)
		if bad {
			return true, why
		}
		if dec != p && depth < 2 {
			if esc, why := pathEscapes(root, dec, depth+1); esc {
				return true, "percent-encoded " + why
			}
		}
	}
	if !ascii && !norm.NFKC.IsNormalString(p) && depth < 2 {
		if esc, why := pathEscapes(root, norm.NFKC.String(p), depth+1); esc {
			return true, "after NFKC normalisation: " + why
		}
	}
	if why := syntaxProblem(p); why != "" {
		return true, why
	}
	return resolvedEscape(root, p)
}

// characterProblem reports whether p is ASCII, and why its characters
// make it escape ("" when they do not): NUL, control and format
// characters, backslashes, invalid UTF-8, unicode dot or slash
// lookalikes.
func characterProblem(p string) (ascii bool, why string) {
	// ASCII, the common case, needs no rune tables; a path with any other
	// byte goes through the general checks, from the start.
	ascii = true
	for i := 0; i < len(p); i++ {
		b := p[i]
		if b >= utf8.RuneSelf {
			ascii = false
			break
		}
		if why == "" {
			switch {
			case b == 0:
				why = "NUL byte"
			case b < 0x20 || b == 0x7f:
				why = "control character"
			case b == '\\':
				why = "backslash"
			}
		}
	}
	if ascii {
		return true, why
	}
	if !utf8.ValidString(p) {
		return false, "invalid or overlong UTF-8"
	}
	for _, r := range p {
		switch {
		case r == 0:
			return false, "NUL byte"
		case unicode.IsControl(r):
			return false, "control character"
		case unicode.Is(unicode.Cf, r):
			return false, "invisible format character"
		case r == '\\':
			return false, "backslash"
		case r >= utf8.RuneSelf && lookalike(r):
			return false, "unicode dot or slash lookalike"
		}
	}
	return false, ""
}

// syntaxProblem is why p has path syntax that can leave the workspace
// whatever root is (drive letters, schemes, colons, network paths,
// variables, parent, dot-only and home segments), or "".
func syntaxProblem(p string) string {
	if i := strings.IndexByte(p, ':'); i >= 0 {
		switch {
		case i == 1 && isASCIILetter(p[0]):
			return "Windows drive letter"
		case strings.Contains(p, "://") || isScheme(p[:i]) && strings.HasPrefix(p[i+1:], "/"):
			return "URL scheme"
		default:
			return "colon (drive, scheme or alternate data stream)"
		}
	}
	if strings.HasPrefix(p, "//") {
		return "network (UNC) path"
	}
	if strings.IndexByte(p, '$') >= 0 {
		return "shell variable expansion"
	}
	for seg := range strings.SplitSeq(p, "/") {
		switch {
		case seg == "..":
			return "parent directory segment"
		case seg != "" && seg != "." && strings.TrimRight(seg, ". ") == "":
			return "dot-only segment"
		case strings.HasPrefix(seg, "~"):
			return "home directory expansion"
		}
	}
	return ""
}

// resolvedEscape reports whether p, resolved against root, lies outside
// root or passes through a symlink farm below it. p has passed
// syntaxProblem: it has no ".." segment, so a relative p lies below root
// as it is, and its segments other than "" and "." are those of root/p
// cleaned.
func resolvedEscape(root, p string) (bool, string) {
	rel := p
	if p[0] == '/' {
		full := path.Clean(p)
		switch {
		case root == "/":
			rel = full
		case full == root:
			rel = ""
		case strings.HasPrefix(full, root+"/"):
			rel = full[len(root):]
		default:
			return true, "outside the workspace root"
		}
	}
	if symlinkFarm(rel) {
		return true, "path through a symlink farm (/proc, /dev/fd)"
	}
	return false, ""
}

// percentDecode decodes every %XX escape of p. It reports bad (with a
// reason) when an escape encodes path syntax or a control byte, or when the
// decoded bytes are not valid UTF-8 (overlong encodings such as %c0%ae).
// A '%' not followed by two hex digits is kept as a literal.
func percentDecode(p string) (dec string, bad bool, why string) {
	var sb strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] != '%' || i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
			sb.WriteByte(p[i])
			continue
		}
		b := unhex(p[i+1])<<4 | unhex(p[i+2])
		switch {
		case b == '.' || b == '/' || b == '\\':
			return "", true, "percent-encoded dot or slash"
		case b == '%':
			return "", true, "double percent-encoding"
		case b < 0x20 || b == 0x7f:
			return "", true, "percent-encoded control byte"
		case b == ':' || b == '~' || b == '$':
			return "", true, "percent-encoded path syntax"
		}
		sb.WriteByte(b)
		i += 2
	}
	dec = sb.String()
	if !utf8.ValidString(dec) {
		return "", true, "percent-encoded invalid or overlong UTF-8"
	}
	return dec, false, ""
}

// slashLookalikes are runes that look like a dot, slash or backslash but
// that NFKC does not map to one.
var slashLookalikes = map[rune]bool{
	0x0337: true, // combining short solidus overlay
	0x0338: true, // combining long solidus overlay
	0x2044: true, // fraction slash
	0x2215: true, // division slash
	0x2216: true, // set minus
	0x2571: true, // box drawings light diagonal upper right to lower left
	0x2572: true, // box drawings light diagonal upper left to lower right
	0x27CB: true, // mathematical rising diagonal
	0x27CD: true, // mathematical falling diagonal
	0x29F5: true, // reverse solidus operator
	0x29F8: true, // big solidus
	0x29F9: true, // big reverse solidus
	0x3002: true, // ideographic full stop
	0xFF61: true, // halfwidth ideographic full stop
	0x1735: true, // philippine single punctuation (slash-like)
}

// lookalike reports whether r (non-ASCII) could be read as path syntax.
func lookalike(r rune) bool {
	if slashLookalikes[r] {
		return true
	}
	s := string(r)
	n := norm.NFKC.String(s)
	return n != s && strings.ContainsAny(n, "./\\:~%$")
}

// symlinkFarm reports whether rel (a path below root, its "" and "."
// segments ignored) passes through a directory of magic links:
// proc/self, proc/thread-self, proc/<pid>, dev/fd and the dev/std* and
// dev/tcp|udp aliases.
func symlinkFarm(rel string) bool {
	var prev string
	for seg := range strings.SplitSeq(rel, "/") {
		if seg == "" || seg == "." {
			continue
		}
		switch prev {
		case "proc":
			if seg == "self" || seg == "thread-self" || isDigits(seg) {
				return true
			}
		case "dev":
			switch seg {
			case "fd", "stdin", "stdout", "stderr", "tcp", "udp":
				return true
			}
		}
		prev = seg
	}
	return false
}

// isScheme reports whether s is a URL scheme (RFC 3986: ALPHA *( ALPHA /
// DIGIT / "+" / "-" / "." )).
func isScheme(s string) bool {
	if s == "" || !isASCIILetter(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isASCIILetter(c) && !(c >= '0' && c <= '9') && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

func isASCIILetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}
