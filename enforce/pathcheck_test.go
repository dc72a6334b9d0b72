package enforce

import (
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

const testRoot = "/work/root"

// pathAttacks must all be denied under testRoot.
var pathAttacks = []struct{ name, path string }{
	{"parent", "../etc/passwd"},
	{"parent deep", "a/b/../../../etc/passwd"},
	{"parent staying inside", "a/../b.txt"},
	{"parent at end", "notes/.."},
	{"absolute outside", "/etc/passwd"},
	{"absolute root", "/"},
	{"absolute with parent", "/work/root/../root2/x"},
	{"root prefix trick", "/work/root2/secret"},
	{"root prefix trick no slash", "/work/rootx"},
	{"parent of root", "/work"},
	{"percent dot dot", "%2e%2e/etc/passwd"},
	{"percent dot uppercase", "%2E%2E%2Fetc%2Fpasswd"},
	{"percent slash", "..%2fetc%2fpasswd"},
	{"percent backslash", "..%5cetc%5cpasswd"},
	{"double encoded dot", "%252e%252e/etc/passwd"},
	{"double encoded slash", "a%252fb"},
	{"overlong dot", "%c0%ae%c0%ae/etc/passwd"},
	{"overlong slash", "..%c0%afetc%c0%afpasswd"},
	{"overlong 3 byte dot", "%e0%80%ae%e0%80%ae/x"},
	{"raw overlong bytes", "\xc0\xae\xc0\xae/etc/passwd"},
	{"percent NUL", "a.txt%00.png"},
	{"percent fullwidth dot", "%ef%bc%8e%ef%bc%8e/etc"},
	{"backslash parent", "..\\..\\windows\\win.ini"},
	{"backslash only", "a\\b"},
	{"NUL byte", "a.txt\x00.png"},
	{"newline", "a\nb"},
	{"DEL", "a\x7fb"},
	{"C1 control", "a\u0085b"},
	{"right-to-left override", "a\u202etxt.exe"},
	{"zero width space segment", "\u200b../x"},
	{"windows drive", "C:\\Windows\\System32"},
	{"windows drive slash", "c:/windows"},
	{"drive relative", "D:secret.txt"},
	{"UNC backslash", "\\\\host\\share\\file"},
	{"UNC slash", "//host/share/file"},
	{"file URL", "file:///etc/passwd"},
	{"http URL", "http://evil.example/x"},
	{"scheme without slashes", "file:/etc/passwd"},
	{"NTFS stream", "notes.txt::$DATA"},
	{"home", "~/.ssh/id_rsa"},
	{"home of user", "~root/.bashrc"},
	{"home in middle", "a/~/b"},
	{"shell variable", "$HOME/.ssh/id_rsa"},
	{"shell variable braces", "${HOME}/x"},
	{"fullwidth dots", "\uff0e\uff0e/etc/passwd"},
	{"fullwidth slash", "..\uff0fetc\uff0fpasswd"},
	{"fullwidth dot in name", "a\uff0eb"},
	{"one dot leader", "\u2024\u2024/etc/passwd"},
	{"two dot leader", "\u2025/etc/passwd"},
	{"ellipsis", "\u2026/x"},
	{"division slash", "..\u2215etc\u2215passwd"},
	{"fraction slash", "..\u2044etc"},
	{"fullwidth backslash", "..\uff3cetc"},
	{"small full stop", "\ufe52\ufe52/x"},
	{"ideographic full stop", "\u3002\u3002/x"},
	{"combining long solidus", "a\u0338b"},
	{"triple dot", ".../x"},
	{"dot dot space", ".. /x"},
	{"dot space dot", ". ./x"},
	{"dot dot trailing dots", "..../etc"},
	{"proc self root", "/proc/self/root/etc/passwd"},
	{"proc self relative", "proc/self/root/etc/passwd"},
	{"proc pid cwd", "proc/1/cwd/secret"},
	{"proc thread-self", "a/proc/thread-self/root"},
	{"dev fd absolute", "/dev/fd/3"},
	{"dev fd relative", "dev/fd/0"},
	{"dev stdin", "x/dev/stdin"},
	{"dev tcp", "dev/tcp/10.0.0.1/80"},
	{"proc self inside root", "/work/root/proc/self/cwd/x"},
	{"too long", strings.Repeat("a/", maxPathBytes)},
	{"invalid utf8", "a\xffb"},
}

// pathBenign must all be allowed under testRoot.
var pathBenign = []string{
	"",
	".",
	"notes/a.txt",
	"./a.txt",
	"a.txt",
	"/work/root",
	"/work/root/",
	"/work/root/a/b",
	"a..b.txt",
	"..hidden-ish",
	".gitignore",
	"dir/.config/x.json",
	"a//b",
	"notes/",
	"file-name_with.dots.v2.tar.gz",
	"backup~",
	"caf\u00e9/r\u00e9sum\u00e9.txt",
	"\u65e5\u672c\u8a9e/\u30d5\u30a1\u30a4\u30eb.txt",
	"100%.txt",
	"report%20final.txt",
	"proc/notes.txt",
	"dev/README",
	"self/root",
	"\ufb01le.txt", // "ﬁ" ligature: NFKC "file.txt"
}

func TestPathEscapesAttacks(t *testing.T) {
	if len(pathAttacks) < 25 {
		t.Fatalf("attack table has %d entries, want >= 25", len(pathAttacks))
	}
	for _, tc := range pathAttacks {
		t.Run(tc.name, func(t *testing.T) {
			esc, why := PathEscapes(testRoot, tc.path)
			if !esc {
				t.Fatalf("PathEscapes(%q) = false, want denied", tc.path)
			}
			if why == "" {
				t.Fatal("denied without a reason")
			}
			if len(tc.path) > 3 && strings.Contains(why, tc.path) {
				t.Fatalf("reason %q echoes the path", why)
			}
		})
	}
}

func TestPathEscapesBenign(t *testing.T) {
	if len(pathBenign) < 10 {
		t.Fatalf("benign table has %d entries, want >= 10", len(pathBenign))
	}
	for _, p := range pathBenign {
		if esc, why := PathEscapes(testRoot, p); esc {
			t.Errorf("PathEscapes(%q) denied (%s), want allowed", p, why)
		}
	}
}

func TestPathEscapesRoots(t *testing.T) {
	cases := []struct {
		root, path string
		want       bool
	}{
		{"/", "/etc/passwd", false},            // the whole tree is the workspace
		{"/", "proc/self/root/x", true},        // but not its symlink farms
		{"/work/root/", "/work/root/a", false}, // root is cleaned
		{"/work/./root", "/work/root/a", false},
		{"relative/root", "a", true}, // a root that is not absolute denies everything
		{"", "a", true},
	}
	for _, tc := range cases {
		if got, why := PathEscapes(tc.root, tc.path); got != tc.want {
			t.Errorf("PathEscapes(%q, %q) = %v (%s), want %v", tc.root, tc.path, got, why, tc.want)
		}
	}
}

func TestPathEscapesReasons(t *testing.T) {
	cases := map[string]string{
		"../x":          "parent directory segment",
		"/etc/passwd":   "outside the workspace root",
		"%2e%2e/x":      "percent-encoded dot or slash",
		"%252e":         "double percent-encoding",
		"%c0%ae":        "percent-encoded invalid or overlong UTF-8",
		"C:/x":          "Windows drive letter",
		"file:///x":     "URL scheme",
		"~/x":           "home directory expansion",
		"a.txt:stream":  "colon (drive, scheme or alternate data stream)",
		"\uff0e\uff0e":  "unicode dot or slash lookalike",
		"proc/self/cwd": "path through a symlink farm (/proc, /dev/fd)",
	}
	for p, want := range cases {
		if _, why := PathEscapes(testRoot, p); why != want {
			t.Errorf("PathEscapes(%q) reason %q, want %q", p, why, want)
		}
	}
}

func FuzzPathEscapes(f *testing.F) {
	for _, tc := range pathAttacks {
		f.Add(tc.path)
	}
	for _, p := range pathBenign {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		esc, why := PathEscapes(testRoot, p)
		if esc == (why == "") {
			t.Fatalf("PathEscapes(%q) = %v with reason %q", p, esc, why)
		}
		if esc {
			return
		}
		// Anything allowed has no ".." segment and resolves inside the root.
		for _, seg := range strings.Split(p, "/") {
			if seg == ".." {
				t.Fatalf("allowed %q with a .. segment", p)
			}
		}
		if strings.HasPrefix(p, "/") && p != testRoot && !strings.HasPrefix(p, testRoot+"/") {
			t.Fatalf("allowed absolute %q outside the root", p)
		}
		if strings.ContainsAny(p, "\\\x00:") {
			t.Fatalf("allowed %q with a backslash, NUL or colon", p)
		}
	})
}

func ExamplePathEscapes() {
	for _, p := range []string{"notes/a.txt", "../etc/passwd", "%2e%2e/etc", "/work/root2/x"} {
		if esc, why := PathEscapes("/work/root", p); esc {
			fmt.Println("deny:", why)
		} else {
			fmt.Println("allow")
		}
	}
	// Output:
	// allow
	// deny: parent directory segment
	// deny: percent-encoded dot or slash
	// deny: outside the workspace root
}

// TestPathEscapesASCIIFastPath: the ASCII fast path answers as the general
// checks do, for every single byte and for paths mixing bad bytes.
func TestPathEscapesASCIIFastPath(t *testing.T) {
	general := func(p string) (bool, string) {
		// The general per-rune checks on their own (what an ASCII path went
		// through before the fast path).
		for _, r := range p {
			switch {
			case r == 0:
				return true, "NUL byte"
			case unicode.IsControl(r):
				return true, "control character"
			case r == '\\':
				return true, "backslash"
			}
		}
		return false, ""
	}
	var paths []string
	for b := 0; b < utf8.RuneSelf; b++ {
		paths = append(paths, "a/"+string(rune(b))+"/c", string(rune(b))+"\\\x00", "x\x7f"+string(rune(b)))
	}
	for _, p := range paths {
		want, wantWhy := general(p)
		got, why := pathEscapes("/w", p, 0)
		if want && (!got || why != wantWhy) {
			t.Errorf("%q: %v %q, want %v %q", p, got, why, want, wantWhy)
		}
	}
	// A non-ASCII byte anywhere sends the path through the general checks:
	// invalid UTF-8 is reported as such even after a NUL.
	if esc, why := pathEscapes("/w", "\x00\xff", 0); !esc || why != "invalid or overlong UTF-8" {
		t.Errorf("NUL then invalid UTF-8: %v %q", esc, why)
	}
}

// BenchmarkPathEscapes: a short relative path, and one of 1.3 KB like
// `talosctl bench`'s 2 KB envelopes carry.
func BenchmarkPathEscapes(b *testing.B) {
	for _, p := range []string{"notes/2024/a.txt", "bench/" + strings.Repeat("x", 1300)} {
		b.Run(fmt.Sprintf("%dB", len(p)), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if esc, why := PathEscapes(testRoot, p); esc {
					b.Fatal(why)
				}
			}
		})
	}
}
