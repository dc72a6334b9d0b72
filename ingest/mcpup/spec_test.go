package mcpup

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParseSpec(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    Spec
		wantErr string // substring; "" means success
	}{
		{name: "http", in: "docs=http://127.0.0.1:8080/mcp", want: Spec{ServerID: "docs", URL: "http://127.0.0.1:8080/mcp"}},
		{name: "https upper-case scheme", in: "docs=HTTPS://example.com/mcp", want: Spec{ServerID: "docs", URL: "HTTPS://example.com/mcp"}},
		{name: "url with query keeps it", in: "d=https://h/mcp?k=v", want: Spec{ServerID: "d", URL: "https://h/mcp?k=v"}},
		{name: "stdio plain", in: "fs=node server.js /tmp/a", want: Spec{ServerID: "fs", Command: []string{"node", "server.js", "/tmp/a"}}},
		{name: "stdio extra blanks", in: " fs =  node   server.js\t/x ", want: Spec{ServerID: "fs", Command: []string{"node", "server.js", "/x"}}},
		{name: "double quotes", in: `fs=node "my server.js" "a\"b" "c\\d"`, want: Spec{ServerID: "fs", Command: []string{"node", "my server.js", `a"b`, `c\d`}}},
		{name: "single quotes literal", in: `fs=sh -c 'echo "$HOME" \n'`, want: Spec{ServerID: "fs", Command: []string{"sh", "-c", `echo "$HOME" \n`}}},
		{name: "adjacent pieces join", in: `fs=a"b c"'d e'f`, want: Spec{ServerID: "fs", Command: []string{"ab cd ef"}}},
		{name: "empty quoted word", in: `fs=prog "" x`, want: Spec{ServerID: "fs", Command: []string{"prog", "", "x"}}},
		{name: "backslash escapes blank", in: `fs=prog my\ dir`, want: Spec{ServerID: "fs", Command: []string{"prog", "my dir"}}},
		{name: "equals in args", in: "fs=prog --root=/srv --x=1", want: Spec{ServerID: "fs", Command: []string{"prog", "--root=/srv", "--x=1"}}},

		{name: "no equals", in: "node server.js", wantErr: "want <server_id>="},
		{name: "bad id upper case", in: "FS=node x", wantErr: `server_id "FS"`},
		{name: "bad id empty", in: "=node x", wantErr: `server_id ""`},
		{name: "bad id with blank", in: "node x --a=b", wantErr: `server_id "node x --a"`},
		{name: "nothing after equals", in: "fs=  ", wantErr: "nothing after '='"},
		{name: "url without host", in: "d=http:///mcp", wantErr: "not a valid http(s) URL"},
		{name: "url with blank", in: "d=http://h/a b", wantErr: "not a valid http(s) URL"},
		{name: "unterminated double", in: `fs=prog "abc`, wantErr: `unterminated " quote`},
		{name: "unterminated single", in: `fs=prog 'abc`, wantErr: "unterminated ' quote"},
		{name: "lone backslash", in: `fs=prog \`, wantErr: "lone backslash"},
		{name: "empty program", in: `fs="" x`, wantErr: "empty command"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseSpec(c.in)
			if c.wantErr != "" {
				if err == nil {
					t.Fatalf("ParseSpec(%q) = %+v, want an error containing %q", c.in, got, c.wantErr)
				}
				if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("ParseSpec(%q) error = %v, want ErrSpec containing %q", c.in, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSpec(%q): %v", c.in, err)
			}
			if got.ServerID != c.want.ServerID || got.URL != c.want.URL || !slices.Equal(got.Command, c.want.Command) {
				t.Fatalf("ParseSpec(%q) = %#v, want %#v", c.in, got, c.want)
			}
		})
	}
}

// TestParseSpecErrorsHideSecrets: a URL with credentials or a command with
// a token never appears in an error or in String.
func TestParseSpecErrorsHideSecrets(t *testing.T) {
	for _, in := range []string{
		"d=https://user:s3cret@/mcp?token=s3cret",
		`fs=prog --token=s3cret "unterminated`,
	} {
		_, err := ParseSpec(in)
		if err == nil {
			t.Fatalf("ParseSpec(%q): no error", in)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("error echoes a secret: %v", err)
		}
	}
	s, err := ParseSpec("d=https://user:s3cret@h.example/mcp?token=s3cret#frag")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.String(); got != "d=https://h.example/mcp" {
		t.Fatalf("String() = %q", got)
	}
	s, err = ParseSpec("fs=prog --token s3cret")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.String(); strings.Contains(got, "s3cret") || !strings.HasPrefix(got, "fs=prog") {
		t.Fatalf("String() = %q", got)
	}
}

func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{"fs=node x", `a=b "c d" 'e'`, "d=https://h/mcp", `x=\`, "=", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSpec(in)
		if err != nil {
			return
		}
		if (s.URL == "") == (len(s.Command) == 0) {
			t.Fatalf("ParseSpec(%q) = %#v: want exactly one of URL and Command", in, s)
		}
		if len(s.Command) > 0 && s.Command[0] == "" {
			t.Fatalf("ParseSpec(%q): empty program", in)
		}
	})
}

func TestParseSpecFor(t *testing.T) {
	cases := []struct {
		name, in, id string
		want         Spec
		wantErr      string
	}{
		{name: "named spec wins", in: "fs=node x", id: "docs", want: Spec{ServerID: "fs", Command: []string{"node", "x"}}},
		{name: "bare command takes the id", in: "node x", id: "docs", want: Spec{ServerID: "docs", Command: []string{"node", "x"}}},
		{name: "bare URL takes the id", in: "http://h/mcp", id: "docs", want: Spec{ServerID: "docs", URL: "http://h/mcp"}},
		{name: "URL with = in its query", in: "https://h/mcp?k=v", id: "d", want: Spec{ServerID: "d", URL: "https://h/mcp?k=v"}},
		{name: "named spec's own error", in: `fs=node "x`, id: "docs", wantErr: "mcpup"},
		{name: "no id to fall back on", in: "node x", wantErr: "want <server_id>="},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseSpecFor(c.in, c.id)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got.ServerID != c.want.ServerID || got.URL != c.want.URL || !slices.Equal(got.Command, c.want.Command) {
				t.Fatalf("= %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func TestParseSpecs(t *testing.T) {
	specs, err := ParseSpecs([]string{"fs=node server.js", "docs=https://h/mcp"})
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 2 || specs[0].ServerID != "fs" || !slices.Equal(specs[0].Command, []string{"node", "server.js"}) ||
		specs[1].ServerID != "docs" || specs[1].URL != "https://h/mcp" {
		t.Fatalf("specs %+v", specs)
	}
	if specs, err := ParseSpecs(nil); err != nil || len(specs) != 0 {
		t.Fatalf("no specs: %v, %v", specs, err)
	}
	cases := []struct {
		name string
		in   []string
		want string
	}{
		{"repeated server id", []string{"fs=node a.js", "docs=https://h/mcp", "fs=node b.js"}, `server_id "fs" given twice`},
		{"a bad spec", []string{"fs=node a.js", "nope"}, "want <server_id>="},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := ParseSpecs(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
		})
	}
}
