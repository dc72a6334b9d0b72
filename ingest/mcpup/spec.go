package mcpup

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/talos-audit/talos/schemas"
)

// Spec says how to reach one upstream MCP server. Exactly one of Command and
// URL is set.
type Spec struct {
	// ServerID names the server in the registry (schemas.ValidID).
	ServerID string
	// Command is the program and its arguments of a stdio server.
	Command []string
	// URL is the endpoint of a streamable HTTP server (http or https).
	URL string
	// Env is added to this process's environment for a stdio server
	// ("KEY=VALUE" entries; later entries win).
	Env []string
	// Wrap, when set, runs a stdio server inside a sandbox (CSP MUST 8):
	// it is given the command (the program resolved on this host) and Env,
	// and returns the command actually started and its whole environment
	// (nothing of this process's environment is added). An error fails
	// Connect with ErrStart; the server is never started unwrapped.
	Wrap func(argv, env []string) (cmd, cmdEnv []string, err error)
}

// ErrSpec is wrapped by every error ParseSpec returns.
var ErrSpec = errors.New("mcpup: bad server spec")

// ParseSpec reads `<server_id>=<url>` (streamable HTTP, http:// or https://)
// or `<server_id>=<command> [args...]` (stdio). The command is split on
// spaces like a shell would, with "..." and '...' quoting and backslash
// escapes, but no expansion of any kind. Errors never repeat the URL or the
// command, which may carry credentials.
func ParseSpec(s string) (Spec, error) {
	id, rest, ok := strings.Cut(s, "=")
	if !ok {
		return Spec{}, fmt.Errorf("%w: want <server_id>=<url> or <server_id>=<command> [args...]", ErrSpec)
	}
	id = strings.TrimSpace(id)
	if !schemas.ValidID(id) {
		return Spec{}, fmt.Errorf("%w: server_id %q must match %s", ErrSpec, id, schemas.IDPattern)
	}
	rest = strings.TrimSpace(rest)
	if rest == "" {
		return Spec{}, fmt.Errorf("%w: server %q: nothing after '=' (want a URL or a command)", ErrSpec, id)
	}
	lower := strings.ToLower(rest)
	if strings.HasPrefix(lower, "http://") || strings.HasPrefix(lower, "https://") {
		u, err := url.Parse(rest)
		if err != nil || u.Host == "" || strings.ContainsAny(rest, " \t\n") {
			return Spec{}, fmt.Errorf("%w: server %q: not a valid http(s) URL", ErrSpec, id)
		}
		return Spec{ServerID: id, URL: rest}, nil
	}
	args, err := splitCommand(rest)
	if err != nil {
		return Spec{}, fmt.Errorf("%w: server %q: %v", ErrSpec, id, err)
	}
	if len(args) == 0 || args[0] == "" {
		return Spec{}, fmt.Errorf("%w: server %q: empty command", ErrSpec, id)
	}
	return Spec{ServerID: id, Command: args}, nil
}

// String is the spec without secrets: the server_id and the URL's scheme,
// host and path, or the command's program name.
func (s Spec) String() string {
	if s.URL != "" {
		return s.ServerID + "=" + safeURL(s.URL)
	}
	if len(s.Command) > 0 {
		return s.ServerID + "=" + s.Command[0] + " …"
	}
	return s.ServerID + "="
}

// safeURL drops userinfo, query and fragment, where tokens live.
func safeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// splitCommand splits a command line on unquoted blanks. Inside '...'
// everything is literal; inside "..." a backslash escapes " and \; outside
// quotes a backslash escapes any character. Adjacent pieces join ("a"'b'c is
// one word abc) and "" is an empty word.
func splitCommand(s string) ([]string, error) {
	var (
		words []string
		cur   strings.Builder
		inTok bool // cur holds a word, possibly empty ("")
	)
	flush := func() {
		if inTok {
			words = append(words, cur.String())
			cur.Reset()
			inTok = false
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case ' ', '\t', '\n', '\r':
			flush()
		case '\\':
			if i+1 >= len(s) {
				return nil, errors.New("command ends with a lone backslash")
			}
			i++
			cur.WriteByte(s[i])
			inTok = true
		case '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("unterminated ' quote in the command")
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
			inTok = true
		case '"':
			i++
			closed := false
			for ; i < len(s); i++ {
				if s[i] == '"' {
					closed = true
					break
				}
				if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
					i++
				}
				cur.WriteByte(s[i])
			}
			if !closed {
				return nil, errors.New(`unterminated " quote in the command`)
			}
			inTok = true
		default:
			cur.WriteByte(c)
			inTok = true
		}
	}
	flush()
	return words, nil
}

// ParseSpecFor is ParseSpec for a caller that already knows the server_id
// (`talosctl registry lint --server-id`): s may then leave out its
// "<server_id>=" and be the URL or command alone. A spec that does begin
// with a valid "<server_id>=" is read as ParseSpec reads it, and its
// error, if any, is ParseSpec's.
func ParseSpecFor(s, serverID string) (Spec, error) {
	spec, err := ParseSpec(s)
	if err == nil || serverID == "" {
		return spec, err
	}
	if id, _, ok := strings.Cut(s, "="); ok && schemas.ValidID(strings.TrimSpace(id)) {
		return spec, err // it did name a server: the error is about the rest
	}
	return ParseSpec(serverID + "=" + s)
}

// ParseSpecs reads the specs of several servers, each as ParseSpec reads
// it, in order. Server ids MUST be unique: a repeated one is an error
// naming it.
func ParseSpecs(ss []string) ([]Spec, error) {
	specs := make([]Spec, 0, len(ss))
	seen := map[string]bool{}
	for _, s := range ss {
		spec, err := ParseSpec(s)
		if err != nil {
			return nil, err
		}
		if seen[spec.ServerID] {
			return nil, fmt.Errorf("server_id %q given twice", spec.ServerID)
		}
		seen[spec.ServerID] = true
		specs = append(specs, spec)
	}
	return specs, nil
}
