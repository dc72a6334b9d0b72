package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/talos-audit/talos/enforce"
	"github.com/talos-audit/talos/ingest/mcpup"
	"github.com/talos-audit/talos/ingest/natsauth"
	"github.com/talos-audit/talos/ingest/sandbox"
	"github.com/talos-audit/talos/receipts"
	"github.com/talos-audit/talos/testenv"
)

var configSpecs = []mcpup.Spec{
	{ServerID: "fs", Command: []string{"node", "fs.js"}},
	{ServerID: "echo", Command: []string{"node", "echo.js"}},
	{ServerID: "docs", URL: "https://docs.example/mcp"},
}

func TestServerFlagParse(t *testing.T) {
	even := func(_, v string) error {
		if len(v)%2 != 0 {
			return errors.New("odd " + v)
		}
		return nil
	}
	cases := []struct {
		name string
		f    ServerFlag
		vals []string
		want map[string][]string
		err  string
	}{
		{"values per server in order", ServerFlag{Name: "x"}, []string{"fs=a", "docs=b", "fs=c=d"},
			map[string][]string{"fs": {"a", "c=d"}, "docs": {"b"}}, ""},
		{"none", ServerFlag{Name: "x"}, nil, map[string][]string{}, ""},
		{"no equals", ServerFlag{Name: "x"}, []string{"fs"}, nil, `--x "fs": want <server_id>=<value>`},
		{"empty value, named", ServerFlag{Name: "x", Value: "dir"}, []string{"fs="}, nil, `--x "fs=": want <server_id>=<dir>`},
		{"unknown server", ServerFlag{Name: "x"}, []string{"nope=a"}, nil, `--x: "nope" is not an --upstream`},
		{"HTTP server where stdio is needed", ServerFlag{Name: "x", StdioOnly: true}, []string{"fs=a", "docs=b"}, nil, `--x: "docs" is not a stdio --upstream`},
		{"stdio only accepts stdio", ServerFlag{Name: "x", StdioOnly: true}, []string{"echo=a"}, map[string][]string{"echo": {"a"}}, ""},
		{"twice where unique", ServerFlag{Name: "x", Unique: true}, []string{"fs=a", "fs=a"}, nil, `--x: server "fs" has more than one`},
		{"twice allowed", ServerFlag{Name: "x"}, []string{"fs=a", "fs=a"}, map[string][]string{"fs": {"a", "a"}}, ""},
		{"check", ServerFlag{Name: "x", Check: even}, []string{"fs=ab", "echo=abc"}, nil, "odd abc"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.f.Parse(c.vals, configSpecs)
			if c.err != "" {
				if err == nil || err.Error() != c.err {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("%v, %v; want %v", got, err, c.want)
			}
		})
	}
}

// configRegistry: fs defers its workspace to the gateway, echo declares
// /srv/echo, docs says nothing.
func configRegistry(t *testing.T) *enforce.Registry {
	t.Helper()
	m := func(server, tool string) []byte {
		return []byte(`{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"` + server + `","tools":[` + tool + `]}`)
	}
	tool := func(extra string) string {
		return `{"tool_name":"t","tool_class":"read","is_document_op":false` + extra + `}`
	}
	reg, err := enforce.NewRegistry(
		m("fs", tool(`,"path_pointers":["/path"],"workspace_root":"enforcement_point"`)),
		m("echo", tool(`,"path_pointers":["/path"],"workspace_root":"/srv/echo"`)),
		m("docs", tool("")),
	)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func TestWorkspaces(t *testing.T) {
	reg := configRegistry(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ws, err := Workspaces([]string{"docs=/srv/docs/./x/", "echo=/srv/echo"}, configSpecs, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"docs": "/srv/docs/x", "echo": "/srv/echo"}; !reflect.DeepEqual(ws, want) {
		t.Fatalf("workspaces %v, want %v", ws, want)
	}
	if !strings.Contains(logs.String(), "server_id=fs") || strings.Count(logs.String(), "level=WARN") != 1 {
		t.Fatalf("want one warning, for fs:\n%s", logs.String())
	}
	for _, c := range []struct{ vals []string }{
		{[]string{"fs=rel/dir"}}, {[]string{"fs=/a", "fs=/b"}}, {[]string{"nope=/a"}}, {[]string{"echo=/srv/other"}}, {[]string{"fs"}},
	} {
		if _, err := Workspaces(c.vals, configSpecs, reg, log); err == nil {
			t.Fatalf("%q: no error", c.vals)
		}
	}
	if _, err := Workspaces([]string{"echo=/srv/other"}, configSpecs, reg, log); err == nil ||
		err.Error() != "--workspace echo=/srv/other: the registry's workspace_root for echo is /srv/echo" {
		t.Fatalf("a workspace the registry contradicts: %v", err)
	}
}

func TestNewHTTPOptions(t *testing.T) {
	dir := t.TempDir()
	tlsFiles := testenv.NewTLSFiles(t, dir)
	is := testenv.NewIssuer(t, t.TempDir())
	static := []*Principal{{Name: "a", TokenSHA256: hexSHA("t")}}
	jwtOnly := []*Principal{{Name: "b", JWTSubject: "b"}}
	tlsOn := HTTPConfig{Listen: "0.0.0.0:0", TLSCert: tlsFiles.CertFile, TLSKey: tlsFiles.KeyFile}
	withJWT := func(c HTTPConfig, file string) HTTPConfig {
		c.JWTIssuer, c.JWTAudience, c.JWKSFile = is.Name, testAudience, file
		return c
	}
	cases := []struct {
		name       string
		c          HTTPConfig
		principals []*Principal
		err        string
	}{
		{"stdio with TLS", HTTPConfig{TLSCert: tlsFiles.CertFile}, static, "are for --listen"},
		{"stdio with JWT", HTTPConfig{JWTIssuer: "i"}, static, "are for --listen"},
		{"no TLS off loopback", HTTPConfig{Listen: "0.0.0.0:0"}, static, "--tls-cert"},
		{"cert without key", HTTPConfig{Listen: "0.0.0.0:0", TLSCert: tlsFiles.CertFile}, static, "go together"},
		{"JWT-only principal without JWT", tlsOn, jwtOnly, "principal b is reached by JWT only"},
		{"unreadable JWKS file", withJWT(tlsOn, filepath.Join(dir, "missing.json")), jwtOnly, "--jwks-file"},
		{"symmetric algorithm", func() HTTPConfig { c := withJWT(tlsOn, is.JWKSFile); c.JWTAlgorithms = []string{"HS256"}; return c }(), jwtOnly, "not allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if o, err := NewHTTPOptions(c.c, c.principals, nil); err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("%+v, %v; want an error naming %q", o, err, c.err)
			}
		})
	}
	if o, err := NewHTTPOptions(HTTPConfig{}, static, nil); o != nil || err != nil {
		t.Fatalf("stdio: %+v, %v; want nil, nil", o, err)
	}
	o, err := NewHTTPOptions(HTTPConfig{Listen: "127.0.0.1:0", InsecurePlainHTTP: true, RefusalRate: 2, RefusalBurst: 7}, static, nil)
	if err != nil || o.TLS != nil || o.JWT != nil || o.Keys != nil || o.Refusals.PerSource != 2 || o.Refusals.PerSourceBurst != 7 {
		t.Fatalf("plain loopback: %+v, %v", o, err)
	}
	o, err = NewHTTPOptions(withJWT(tlsOn, is.JWKSFile), jwtOnly, nil)
	if err != nil || o.TLS == nil || o.JWT == nil || o.Keys == nil || o.Addr != "0.0.0.0:0" || len(o.Principals) != 1 {
		t.Fatalf("TLS and JWT: %+v, %v", o, err)
	}
}

// TestPrepare: a Config is validated in order, its mistakes are ErrUsage
// and a sandbox that cannot be set up is not; a good one is composed.
func TestPrepare(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "registry.json")
	if err := os.WriteFile(reg, []byte(`{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"fs","tools":[`+
		`{"tool_name":"read","tool_class":"read","is_document_op":false,"path_pointers":["/path"],"workspace_root":"enforcement_point"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func() Config {
		return Config{EPID: "gw-1", Registry: reg, Upstreams: []string{"fs=/bin/true", "docs=https://docs.example/mcp"},
			NATS: natsauth.Login{UsersFile: natsauth.None}, Logger: slog.New(slog.DiscardHandler)}
	}
	cases := []struct {
		name  string
		edit  func(*Config)
		usage bool
		want  string
	}{
		{"bad ep id", func(c *Config) { c.EPID = "GW 1" }, true, "--ep-id"},
		{"missing registry", func(c *Config) { c.Registry = filepath.Join(dir, "none") }, true, "none"},
		{"principals in stdio", func(c *Config) { c.Principals = reg }, true, "--principals is for --listen"},
		{"listen without principals", func(c *Config) { c.HTTP.Listen = "127.0.0.1:0" }, true, "--listen needs --principals"},
		{"TLS in stdio", func(c *Config) { c.HTTP.TLSKey = reg }, true, "are for --listen"},
		{"metrics address with --listen", func(c *Config) {
			c.HTTP = HTTPConfig{Listen: "127.0.0.1:0", InsecurePlainHTTP: true}
			c.Principals = writeFile(t, dir, `{"principals":[{"name":"a","token_sha256":"`+strings.Repeat("a", 64)+`","agent_id":"a"}]}`)
			c.MetricsAddr = "127.0.0.1:0"
		}, true, "--metrics-addr is for the stdio mode"},
		{"metrics address without a port", func(c *Config) { c.MetricsAddr = "127.0.0.1" }, true, `--metrics-addr "127.0.0.1": `},
		{"bad upstream", func(c *Config) { c.Upstreams = []string{"fs"} }, true, "--upstream: "},
		{"upstream twice", func(c *Config) { c.Upstreams = []string{"fs=/bin/true", "fs=/bin/false"} }, true, `--upstream: server_id "fs" given twice`},
		{"credentials for an unknown server", func(c *Config) { c.Credentials = writeFile(t, dir, `{"servers":{"x":{"mode":"none"}}}`) }, true, "not an upstream"},
		{"NATS users file missing", func(c *Config) { c.NATS.UsersFile = filepath.Join(dir, "users") }, true, "--nats-auth: "},
		{"trusted keys missing", func(c *Config) { c.TrustedKeys = []string{filepath.Join(dir, "none.pub")} }, true, "--trusted-keys: "},
		{"relative workspace", func(c *Config) { c.Workspaces = []string{"fs=ws"} }, true, "not an absolute path"},
		{"sandbox flags without --sandbox", func(c *Config) { c.Sandbox.ReadOnly = []string{dir} }, true, "need --sandbox"},
		{"egress for an HTTP upstream", func(c *Config) { c.Sandbox = SandboxConfig{Enabled: true, Egress: []string{"docs=a:1"}} }, true, "not a stdio --upstream"},
		{"sandbox without a workspace", func(c *Config) { c.Sandbox.Enabled = true }, true, "no workspace for server"},
		{"sandbox variable unset", func(c *Config) {
			c.Sandbox = SandboxConfig{Enabled: true, Env: []string{"fs=X"}}
			c.Workspaces = []string{"fs=" + dir}
			c.LookupEnv = func(string) (string, bool) { return "", false }
			c.SpoolDir = dir
		}, true, "X is not set"},
		{"no directory for the default spool", func(c *Config) { c.LookupEnv = func(string) (string, bool) { return "", false } },
			true, "--spool-dir is required"},
		{"bwrap missing", func(c *Config) {
			c.Sandbox = SandboxConfig{Enabled: true, Bwrap: "/nonexistent/bwrap"}
			c.Workspaces = []string{"fs=" + dir}
		}, false, "bubblewrap not found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := base()
			c.edit(&cfg)
			s, err := Prepare(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, ErrUsage) != c.usage {
				t.Fatalf("%v, %v; want an error naming %q, ErrUsage %v", s, err, c.want, c.usage)
			}
			if !c.usage && !errors.Is(err, sandbox.ErrSetup) {
				t.Fatalf("%v: want sandbox.ErrSetup", err)
			}
		})
	}
	cfg := base()
	cfg.Workspaces = []string{"fs=" + dir + "/"}
	s, err := Prepare(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.Principals) != 1 || s.Principals[0].Name != "stdio" || s.Principals[0].AgentID != "gw-1" || s.HTTP != nil ||
		len(s.Upstreams) != 2 || s.Upstreams[0].Wrap != nil || s.Workspaces["fs"] != dir || len(s.NATS) == 0 ||
		s.Credentials == nil || s.Discovery.Registry != s.Registry || s.Registry == nil ||
		s.SpoolDir != must(DefaultSpoolDir("gw-1", os.LookupEnv)) || !strings.HasSuffix(s.SpoolDir, "/talos-mcp-gateway/gw-1") {
		t.Fatalf("setup %+v", s)
	}
}

// TestPrepareStaticTokenSecret: a secret credential that is one of the
// principals' static bearer tokens is refused at start (CSP MUST 5),
// naming the server and the principal, never the secret; another secret
// is accepted.
func TestPrepareStaticTokenSecret(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "registry.json")
	if err := os.WriteFile(reg, []byte(`{"schema_id":"talos.mcp.tool_registry","schema_version":"v1","server_id":"docs","tools":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	hash := func(tok string) string { sum := sha256.Sum256([]byte(tok)); return hex.EncodeToString(sum[:]) }
	principals := writeFile(t, dir, `{"principals":[{"name":"alice","token_sha256":"`+hash("alice-static-token")+`"},`+
		`{"name":"bob","token_sha256":"`+strings.ToUpper(hash("bob-static-token"))+`"}]}`)
	if err := os.WriteFile(filepath.Join(dir, "docs.token"), []byte("bob-static-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	prepare := func(credentials, secret string) (*Setup, error) {
		return Prepare(context.Background(), Config{EPID: "gw-1", Registry: reg, Upstreams: []string{"docs=https://docs.example/mcp"},
			NATS: natsauth.Login{UsersFile: natsauth.None}, Logger: slog.New(slog.DiscardHandler), SpoolDir: dir,
			Principals: principals, HTTP: HTTPConfig{Listen: "127.0.0.1:0", InsecurePlainHTTP: true},
			Credentials: writeFile(t, dir, credentials),
			LookupEnv:   func(k string) (string, bool) { return secret, k == "DOCS_TOKEN" }})
	}
	for name, creds := range map[string]string{
		"from the environment": `{"servers":{"docs":{"mode":"secret","secret_env":"DOCS_TOKEN"}}}`,
		"from a file":          `{"servers":{"docs":{"mode":"secret","secret_file":"docs.token"}}}`,
	} {
		s, err := prepare(creds, "bob-static-token")
		if err == nil || !errors.Is(err, ErrUsage) || strings.Contains(err.Error(), "bob-static-token") ||
			!strings.Contains(err.Error(), "server docs: its secret is principal bob's bearer token") {
			t.Fatalf("%s: %v, %v; want a usage error naming the server and the principal", name, s, err)
		}
	}
	s, err := prepare(`{"servers":{"docs":{"mode":"secret","secret_env":"DOCS_TOKEN"}}}`, "docs-upstream-secret")
	if err != nil {
		t.Fatalf("a secret of its own: %v", err)
	}
	s.Close()
}

// TestDefaultSpoolDir: the user's state directory, per ep id; none
// without an absolute $XDG_STATE_HOME or $HOME.
func TestDefaultSpoolDir(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"XDG state home", map[string]string{"XDG_STATE_HOME": "/st", "HOME": "/home/u"}, "/st/talos-mcp-gateway/gw-1"},
		{"relative XDG state home ignored", map[string]string{"XDG_STATE_HOME": "st", "HOME": "/home/u"}, "/home/u/.local/state/talos-mcp-gateway/gw-1"},
		{"home", map[string]string{"HOME": "/home/u"}, "/home/u/.local/state/talos-mcp-gateway/gw-1"},
		{"relative home", map[string]string{"HOME": "u"}, ""},
		{"neither", nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := DefaultSpoolDir("gw-1", func(k string) (string, bool) { v, ok := c.env[k]; return v, ok })
			if got != c.want || (err != nil) != (c.want == "") {
				t.Fatalf("%q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func must(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}

func writeFile(t *testing.T, dir, content string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "*.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// TestTrustedKeys: --trusted-keys is read as given; without it, talosd's
// signers beside the NATS users file (its data dir), else none, which is
// logged as an error: no approval can be applied.
func TestTrustedKeys(t *testing.T) {
	dataDir := t.TempDir()
	usersFile := filepath.Join(dataDir, "nats-auth.json")
	key, err := receipts.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, _, err := receipts.KeepPublicKey(filepath.Join(dataDir, "keys", "signers"), key)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if got := DefaultTrustedKeys(usersFile); got != filepath.Join(dataDir, "keys", "signers") {
		t.Fatalf("default beside the users file: %s", got)
	}
	if got := DefaultTrustedKeys(natsauth.None); got != filepath.Join("talos-data", "keys", "signers") {
		t.Fatalf("default without a users file: %s", got)
	}
	for name, c := range map[string]struct {
		paths     []string
		usersFile string
	}{
		"given":                 {[]string{pub}, natsauth.None},
		"beside the users file": {nil, usersFile},
	} {
		keys, err := TrustedKeys(c.paths, c.usersFile, log)
		if err != nil || len(keys) != 1 || keys[key.KID] == nil {
			t.Fatalf("%s: %v %v", name, keys, err)
		}
	}
	logs.Reset()
	keys, err := TrustedKeys(nil, filepath.Join(t.TempDir(), "nats-auth.json"), log)
	if err != nil || len(keys) != 0 {
		t.Fatalf("no default signers: %v %v", keys, err)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "approvals cannot be applied") {
		t.Fatalf("no keys is not said clearly:\n%s", logs.String())
	}
	empty := t.TempDir()
	if _, err := TrustedKeys([]string{empty}, natsauth.None, log); err == nil {
		t.Fatal("a --trusted-keys directory without keys was accepted")
	}
}
