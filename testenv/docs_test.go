package testenv_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	repoPath   = regexp.MustCompile(`^[a-z0-9_.-]+(/[A-Za-z0-9_.-]+)+\.(go|json|sh|yml|yaml|md|mjs)$`)
	identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)
	testName   = regexp.MustCompile(`\b(Test|Fuzz|Benchmark|Example)[A-Za-z0-9_]*`)
)

// TestDocsCiteCodeThatExists reads the pages that say where things are
// implemented and tested (docs/REQUIREMENTS.md, docs/DESIGN.md, README.md)
// and checks every repository path they cite exists and, in a table row,
// that each name cited after a Go file (a function, a type, a test) is in
// that file: the documentation must not point at code that moved or went.
func TestDocsCiteCodeThatExists(t *testing.T) {
	root := filepath.Join("..")
	pkgs := packageDirs(t, root)
	for _, page := range []string{"docs/REQUIREMENTS.md", "docs/DESIGN.md", "README.md", "BENCHMARKS.md"} {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			checkDocLine(t, root, page, n+1, line)
			checkQualified(t, pkgs, page, n+1, line)
		}
	}
}

// checkDocLine checks the citations of one line: paths always; in a table
// row, names that follow a Go file in the same cell.
func checkDocLine(t *testing.T, root, page string, n int, line string) {
	t.Helper()
	table := strings.HasPrefix(line, "|")
	for _, cell := range strings.Split(line, "|") {
		var file string // the Go file the cell last named
		var src []byte
		for _, part := range splitCitations(cell) {
			tok, quoted := part.text, part.quoted
			switch {
			case quoted && repoPath.MatchString(tok) && !runtimePath(root, tok):
				b, err := os.ReadFile(filepath.Join(root, tok))
				if err != nil {
					t.Errorf("%s:%d: %s does not exist", page, n, tok)
					file, src = "", nil
					continue
				}
				file, src = "", nil
				if strings.HasSuffix(tok, ".go") {
					file, src = tok, b
				}
			case table && file != "" && quoted && goName(tok):
				name := tok[strings.LastIndex(tok, ".")+1:]
				if !regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`).Match(src) {
					t.Errorf("%s:%d: %s does not mention %s", page, n, file, tok)
				}
			case table && file != "" && !quoted && strings.HasSuffix(file, "_test.go"):
				for _, name := range testName.FindAllString(tok, -1) {
					if !regexp.MustCompile(`func ` + regexp.QuoteMeta(name) + `\(`).Match(src) {
						t.Errorf("%s:%d: %s has no %s", page, n, file, name)
					}
				}
			}
		}
	}
}

// runtimePath reports whether p is not the repository's: a file a run
// creates (talos-data/…) or a path relative to a package, whose first
// element is no top-level entry.
func runtimePath(root, p string) bool {
	first, _, _ := strings.Cut(p, "/")
	if first == "talos-data" {
		return true
	}
	_, err := os.Stat(filepath.Join(root, first))
	return err != nil
}

// goName reports whether tok reads as a Go name (Begin, memberHash,
// Decider.Begin) rather than a wire name (tool_id), a code
// (REGISTRY_VERSION_MISMATCH) or a file name.
func goName(tok string) bool {
	if !identifier.MatchString(tok) || strings.HasSuffix(tok, ".go") || tok == strings.ToUpper(tok) {
		return false
	}
	return !strings.Contains(tok, "_") || tok != strings.ToLower(tok)
}

var qualified = regexp.MustCompile("`([a-z][a-z0-9]*)\\.([A-Z][A-Za-z0-9_]*)(\\.[A-Za-z][A-Za-z0-9_]*)?[`(]")

// checkQualified checks that every `pkg.Name` (or `pkg.Type.Method`) a line
// cites, for a package of this repository, is declared in that package.
func checkQualified(t *testing.T, pkgs map[string][]string, page string, n int, line string) {
	t.Helper()
	for _, m := range qualified.FindAllStringSubmatch(line, -1) {
		dirs, ok := pkgs[m[1]]
		if !ok {
			continue // not one of ours (http.Handler, nats.Conn, …)
		}
		decl := regexp.MustCompile(`(?m)^(func (\([^)]*\) )?|type |\t|var |const )` + regexp.QuoteMeta(m[2]) + `\b`)
		found := false
		for _, dir := range dirs {
			files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
			for _, f := range files {
				if b, err := os.ReadFile(f); err == nil && decl.Match(b) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("%s:%d: package %s declares no %s", page, n, m[1], m[2])
		}
	}
}

// packageDirs maps each package name of the repository to its folders.
func packageDirs(t *testing.T, root string) map[string][]string {
	pkgs := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "talos-data" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if m := regexp.MustCompile(`(?m)^package (\w+)`).FindSubmatch(b); m != nil && string(m[1]) != "main" && !strings.HasSuffix(string(m[1]), "_test") {
			dir := filepath.Dir(path)
			name := string(m[1])
			if len(pkgs[name]) == 0 || pkgs[name][len(pkgs[name])-1] != dir {
				pkgs[name] = append(pkgs[name], dir)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

type citation struct {
	text   string
	quoted bool
}

// splitCitations splits s into its backticked tokens and the text between
// them, in order.
func splitCitations(s string) []citation {
	var out []citation
	last := 0
	for _, m := range backticked.FindAllStringSubmatchIndex(s, -1) {
		out = append(out, citation{s[last:m[0]], false}, citation{s[m[2]:m[3]], true})
		last = m[1]
	}
	return append(out, citation{s[last:], false})
}
