// Package credential is the MCP gateway's credential broker (CSP MUST 5):
// for each upstream server it says which credential the gateway sends
// there, never the client's own token. A server's mode is none (nothing
// is sent), secret (the gateway's own secret for that server, from a file
// or from the gateway's environment) or token_exchange (the client's
// validated JWT exchanged, RFC 8693, for a token whose audience is that
// server; the session's own requests carry a token the gateway obtains
// for itself, RFC 6749 client credentials, for that same audience). Every
// call's handling is recorded as schemas.TokenHandling.
package credential

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// File is the JSON of the gateway's --credentials file: one entry per
// upstream server_id. A server without an entry is mode none.
//
//	{"servers": {
//	  "github": {"mode": "secret", "secret_file": "github.token"},
//	  "tickets": {"mode": "secret", "secret_env": "TICKETS_TOKEN", "stdio_env": "API_TOKEN"},
//	  "crm": {"mode": "token_exchange", "token_endpoint": "https://sts.example/token",
//	          "client_id": "talos-gateway", "client_secret_file": "sts.secret",
//	          "audience": "crm", "resource": "https://crm.example/mcp", "scope": ["crm.read"]}}}
type File struct {
	Servers map[string]Server `json:"servers"`
}

// Server is how the gateway obtains the credential of one upstream server.
type Server struct {
	Mode string `json:"mode"` // none | secret | token_exchange

	// Mode secret: exactly one of SecretFile (its content, trimmed) and
	// SecretEnv (a variable of the gateway's own environment). An HTTP
	// upstream gets it as a bearer token on every request; a stdio
	// upstream gets it in the environment variable StdioEnv.
	SecretFile string `json:"secret_file,omitempty"`
	SecretEnv  string `json:"secret_env,omitempty"`
	StdioEnv   string `json:"stdio_env,omitempty"`

	// Mode token_exchange (HTTP upstreams only): the token endpoint and the
	// gateway's client credentials there (the secret from a file or the
	// gateway's environment; none for a public client).
	TokenEndpoint    string   `json:"token_endpoint,omitempty"`
	ClientID         string   `json:"client_id,omitempty"`
	ClientSecretFile string   `json:"client_secret_file,omitempty"`
	ClientSecretEnv  string   `json:"client_secret_env,omitempty"`
	Scope            []string `json:"scope,omitempty"`
	// Resource is the RFC 8707 resource indicator (default: the upstream's
	// URL).
	Resource string `json:"resource,omitempty"`
	// Timeout bounds one request to the token endpoint ("10s" by default).
	Timeout string `json:"timeout,omitempty"`
	// Session is what the session's own requests (initialize, tools/list,
	// its stream) carry: SessionClientCredentials (the default) or
	// SessionNone, for an upstream that serves them unauthenticated.
	Session string `json:"session,omitempty"`

	// Audience is the audience the credential is bound to, recorded in
	// receipts and asked for in an exchange (default: the server_id).
	Audience string `json:"audience,omitempty"`
}

// Upstream is what Load needs to know of an upstream server: its URL, or
// "" for a stdio server.
type Upstream struct {
	ServerID string
	URL      string
}

// server is one server's validated configuration, with its secrets read.
type server struct {
	mode, audience string
	secret         *secretSource
	stdioEnv       string
	endpoint       string
	clientID       string
	clientSecret   *secretSource
	scope          []string
	resource       string
	timeout        time.Duration
	// ownSession: the session's own requests carry the gateway's own
	// client-credentials token (token_exchange, session client_credentials).
	ownSession bool
}

// What a token_exchange server's session requests carry (Server.Session).
const (
	SessionClientCredentials = "client_credentials"
	SessionNone              = "none"
)

// Config is a validated --credentials file: what the broker needs, secrets
// included. Build a Broker with New.
type Config struct {
	servers map[string]*server
}

// Load reads and validates a --credentials file against the gateway's
// upstreams; relative paths in it are relative to the file, and secrets
// are read now: a secret_file or client_secret_file again whenever it
// changes (secretSource), one from the environment never; a stdio
// upstream's secret is in its environment from its start. lookupEnv reads the
// gateway's environment (os.LookupEnv). Every server_id must be an
// upstream's; token_exchange needs an HTTP upstream and a secret for a
// stdio upstream needs stdio_env. Errors never repeat a secret.
func Load(path string, ups []Upstream, lookupEnv func(string) (string, bool)) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f File
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("--credentials %s: %w", path, err)
	}
	urls := map[string]string{}
	known := map[string]bool{}
	for _, u := range ups {
		urls[u.ServerID], known[u.ServerID] = u.URL, true
	}
	cfg := &Config{servers: map[string]*server{}}
	for id, s := range f.Servers {
		if !known[id] {
			return nil, fmt.Errorf("--credentials %s: server %q is not an upstream", path, id)
		}
		srv, err := s.validate(id, urls[id], filepath.Dir(path), lookupEnv)
		if err != nil {
			return nil, fmt.Errorf("--credentials %s: server %s: %w", path, id, err)
		}
		cfg.servers[id] = srv
	}
	return cfg, nil
}

// LoadBroker is the broker of a gateway's --credentials file (Load, then
// New): with no file (path ""), every server is mode none.
func LoadBroker(path string, ups []Upstream, lookupEnv func(string) (string, bool), o Options) (*Broker, error) {
	if path == "" {
		return New(nil, o), nil
	}
	cfg, err := Load(path, ups, lookupEnv)
	if err != nil {
		return nil, err
	}
	return New(cfg, o), nil
}

func (s Server) validate(id, url, dir string, lookupEnv func(string) (string, bool)) (*server, error) {
	srv := &server{mode: s.Mode, audience: s.Audience, stdioEnv: s.StdioEnv}
	if srv.audience == "" {
		srv.audience = id
	}
	switch s.Mode {
	case schemas.TokenModeNone:
		if s.SecretFile != "" || s.SecretEnv != "" || s.StdioEnv != "" || s.TokenEndpoint != "" || s.ClientID != "" ||
			s.ClientSecretFile != "" || s.ClientSecretEnv != "" || s.Scope != nil || s.Resource != "" || s.Timeout != "" || s.Session != "" {
			return nil, errors.New("mode none takes no other field but audience")
		}
		srv.audience = ""
		return srv, nil
	case schemas.TokenModeSecret:
		if s.TokenEndpoint != "" || s.ClientID != "" || s.ClientSecretFile != "" || s.ClientSecretEnv != "" || s.Scope != nil || s.Resource != "" || s.Timeout != "" || s.Session != "" {
			return nil, errors.New("mode secret takes secret_file or secret_env, stdio_env and audience only")
		}
		if url == "" && s.StdioEnv == "" {
			return nil, errors.New("a stdio upstream gets its secret in an environment variable: stdio_env is required")
		}
		if url != "" && s.StdioEnv != "" {
			return nil, errors.New("stdio_env is for stdio upstreams; an HTTP upstream gets the secret as a bearer token")
		}
		var err error
		srv.secret, err = readSecret("secret", s.SecretFile, s.SecretEnv, dir, lookupEnv, true)
		return srv, err
	case schemas.TokenModeTokenExchange:
		return s.exchange(srv, url, dir, lookupEnv)
	default:
		return nil, fmt.Errorf("mode %q: want none, secret or token_exchange", s.Mode)
	}
}

func (s Server) exchange(srv *server, url, dir string, lookupEnv func(string) (string, bool)) (*server, error) {
	switch {
	case url == "":
		return nil, errors.New("token_exchange needs an HTTP upstream (a stdio server's environment is fixed when it starts)")
	case s.SecretFile != "" || s.SecretEnv != "" || s.StdioEnv != "":
		return nil, errors.New("token_exchange takes no secret_file, secret_env or stdio_env")
	case !strings.HasPrefix(s.TokenEndpoint, "https://") && !strings.HasPrefix(s.TokenEndpoint, "http://"):
		return nil, errors.New("token_exchange needs token_endpoint, an http(s) URL")
	case s.ClientID == "":
		return nil, errors.New("token_exchange needs client_id (the gateway's client at the token endpoint)")
	}
	srv.endpoint, srv.clientID, srv.scope = s.TokenEndpoint, s.ClientID, s.Scope
	srv.resource = s.Resource
	if srv.resource == "" {
		srv.resource = url
	}
	srv.timeout = 10 * time.Second
	if s.Timeout != "" {
		d, err := time.ParseDuration(s.Timeout)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("timeout %q: want a positive duration", s.Timeout)
		}
		srv.timeout = d
	}
	switch s.Session {
	case "", SessionClientCredentials:
		srv.ownSession = true
	case SessionNone:
	default:
		return nil, fmt.Errorf("session %q: want %s or %s", s.Session, SessionClientCredentials, SessionNone)
	}
	var err error
	srv.clientSecret, err = readSecret("client_secret", s.ClientSecretFile, s.ClientSecretEnv, dir, lookupEnv, false)
	return srv, err
}

// readSecret is a secret from a file (relative to dir) or from the
// gateway's environment; at most one source, exactly one when required
// (nil: none).
func readSecret(what, file, env, dir string, lookupEnv func(string) (string, bool), required bool) (*secretSource, error) {
	switch {
	case file != "" && env != "":
		return nil, fmt.Errorf("%s_file and %s_env exclude each other", what, what)
	case file != "":
		if !filepath.IsAbs(file) {
			file = filepath.Join(dir, file)
		}
		s, err := fileSecret(file)
		if errors.Is(err, errEmptySecret) {
			return nil, fmt.Errorf("%s_file %s is empty", what, file)
		}
		if err != nil {
			return nil, fmt.Errorf("%s_file: %w", what, err)
		}
		return s, nil
	case env != "":
		v, ok := lookupEnv(env)
		if !ok || strings.TrimSpace(v) == "" {
			return nil, fmt.Errorf("%s_env: $%s is not set in the gateway's environment", what, env)
		}
		return fixedSecret(strings.TrimSpace(v)), nil
	case required:
		return nil, fmt.Errorf("%s_file or %s_env is required", what, what)
	}
	return nil, nil
}
