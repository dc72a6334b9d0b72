package mcpup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ErrStart is wrapped when a stdio server's process could not be started
// (program not found, not executable), as opposed to a server that started
// and then failed the MCP handshake.
var ErrStart = errors.New("mcpup: server process failed to start")

// Option adjusts Connect.
type Option func(*options)

type options struct {
	features   func(Features) // ListServer: also list prompts and resources (WithFeatures)
	terminate  time.Duration
	stderr     io.Writer
	httpClient *http.Client
	client     *mcp.ClientOptions
	sending    []mcp.Middleware
	receiving  []mcp.Middleware
	wrap       []func(mcp.Transport) mcp.Transport
	rejected   func(Rejected)
}

// WithStderr sends a stdio server's standard error to w instead of
// os.Stderr (io.Discard drops it).
func WithStderr(w io.Writer) Option { return func(o *options) { o.stderr = w } }

// WithTerminateWait sets how long closing a stdio session waits for the
// process to exit after its stdin is closed, and again after SIGTERM,
// before killing it (default: the SDK's 5s).
func WithTerminateWait(d time.Duration) Option { return func(o *options) { o.terminate = d } }

// WithHTTPClient makes a streamable HTTP connection use c (for TLS settings,
// timeouts, or headers added by its transport).
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.httpClient = c } }

// WithClientOptions passes o to mcp.NewClient (notification handlers such as
// ToolListChangedHandler, a logger, capabilities).
func WithClientOptions(o *mcp.ClientOptions) Option { return func(opts *options) { opts.client = o } }

// WithSendingMiddleware adds mw to the client's sending middleware
// (mcp.Client.AddSendingMiddleware), around every request it sends.
func WithSendingMiddleware(mw ...mcp.Middleware) Option {
	return func(opts *options) { opts.sending = append(opts.sending, mw...) }
}

// WithReceivingMiddleware adds mw to the client's receiving middleware
// (mcp.Client.AddReceivingMiddleware), around every request and
// notification the server sends it.
func WithReceivingMiddleware(mw ...mcp.Middleware) Option {
	return func(opts *options) { opts.receiving = append(opts.receiving, mw...) }
}

// WithTransport has the session use wrap(t) for its transport t (to see
// the messages it writes and reads). Several wrap in the order given, the
// first nearest the wire.
func WithTransport(wrap func(mcp.Transport) mcp.Transport) Option {
	return func(opts *options) { opts.wrap = append(opts.wrap, wrap) }
}

// transport is t as WithRejected and WithTransport wrap it (the list
// filter nearest the wire) for server serverID.
func (o *options) transport(t mcp.Transport, serverID string) mcp.Transport {
	if o.rejected != nil {
		t = listFilter{Transport: t, server: serverID, report: o.rejected}
	}
	for _, w := range o.wrap {
		t = w(t)
	}
	return t
}

// Connect starts or dials the upstream server s and completes the MCP
// handshake as client. The caller owns the session and MUST Close it; for
// stdio that ends the child process (stdin closed, then SIGTERM and SIGKILL
// if it lingers; WithTerminateWait). On Linux a stdio server is also
// killed when the calling process dies, however it dies. ctx bounds the
// connection and handshake only, not the session's lifetime. Errors name
// the server_id and say whether the process failed to start (ErrStart) or
// the handshake failed; they never repeat the command's arguments or the
// URL's credentials.
func Connect(ctx context.Context, s Spec, client *mcp.Implementation, opts ...Option) (*mcp.ClientSession, error) {
	o := options{stderr: os.Stderr}
	for _, opt := range opts {
		opt(&o)
	}
	if client == nil {
		client = &mcp.Implementation{Name: "talos", Version: "dev"}
	}
	c := mcp.NewClient(client, o.client)
	if len(o.sending) > 0 {
		c.AddSendingMiddleware(o.sending...)
	}
	if len(o.receiving) > 0 {
		c.AddReceivingMiddleware(o.receiving...)
	}
	switch {
	case s.URL != "" && len(s.Command) > 0:
		return nil, fmt.Errorf("mcpup: server %q: both a URL and a command are set", s.ServerID)
	case s.URL != "":
		t := &mcp.StreamableClientTransport{Endpoint: s.URL, HTTPClient: o.httpClient}
		cs, err := c.Connect(ctx, o.transport(t, s.ServerID), nil)
		if err != nil {
			return nil, scrubURL(fmt.Errorf("mcpup: server %q: connect to %s over streamable HTTP: %w", s.ServerID, safeURL(s.URL), err), s.URL)
		}
		return cs, nil
	case len(s.Command) > 0:
		return connectStdio(ctx, c, s, o)
	default:
		return nil, fmt.Errorf("mcpup: server %q: neither a URL nor a command is set", s.ServerID)
	}
}

func connectStdio(ctx context.Context, c *mcp.Client, s Spec, o options) (*mcp.ClientSession, error) {
	prog := s.Command[0]
	path, err := exec.LookPath(prog)
	if err != nil {
		return nil, fmt.Errorf("%w: server %q: %v", ErrStart, s.ServerID, err)
	}
	// Not exec.CommandContext: ctx bounds the handshake, while the process
	// lives as long as the session; ClientSession.Close ends it.
	cmd := exec.Command(path, s.Command[1:]...)
	if s.Wrap != nil {
		argv, env, err := s.Wrap(append([]string{path}, s.Command[1:]...), s.Env)
		if err != nil {
			return nil, fmt.Errorf("%w: server %q: %v", ErrStart, s.ServerID, err)
		}
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Env = append([]string{}, env...)
	} else if len(s.Env) > 0 {
		cmd.Env = append(os.Environ(), s.Env...)
	}
	cmd.Stderr = o.stderr
	dieWithParent(cmd)
	cs, err := c.Connect(ctx, o.transport(&mcp.CommandTransport{Command: cmd, TerminateDuration: o.terminate}, s.ServerID), nil)
	if err == nil {
		return cs, nil
	}
	if cmd.Process == nil {
		return nil, fmt.Errorf("%w: server %q: %s: %v", ErrStart, s.ServerID, prog, err)
	}
	// The SDK closed the session, which waited for the process.
	if st := cmd.ProcessState; st != nil && st.Exited() && st.ExitCode() != 0 {
		return nil, fmt.Errorf("mcpup: server %q: %s started but exited with status %d before the MCP handshake completed (see its stderr): %w", s.ServerID, prog, st.ExitCode(), err)
	}
	return nil, fmt.Errorf("mcpup: server %q: %s started but the MCP handshake failed: %w", s.ServerID, prog, err)
}

// scrubbedError prints a message with an endpoint's secrets removed while
// errors.Is and errors.As still see the cause.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrubURL removes rawURL's userinfo and query from err's message (the
// HTTP client quotes the URL it failed to reach).
func scrubURL(err error, rawURL string) error {
	u, perr := url.Parse(rawURL)
	if perr != nil {
		return err
	}
	msg := err.Error()
	safe := safeURL(rawURL)
	for _, form := range []string{rawURL, u.String(), u.Redacted()} {
		msg = strings.ReplaceAll(msg, form, safe)
	}
	if u.RawQuery != "" {
		msg = strings.ReplaceAll(msg, u.RawQuery, "…")
	}
	if p, ok := u.User.Password(); ok && p != "" {
		msg = strings.ReplaceAll(msg, p, "***")
	}
	if n := u.User.Username(); len(n) >= 4 {
		msg = strings.ReplaceAll(msg, n, "***")
	}
	return &scrubbedError{msg: msg, err: err}
}

// ListTools returns every tool the server lists, following pagination
// cursors to the end.
func ListTools(ctx context.Context, cs *mcp.ClientSession) ([]*mcp.Tool, error) {
	var tools []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("mcpup: tools/list: %w", err)
		}
		tools = append(tools, t)
	}
	return tools, nil
}

// ListServer connects to s, lists every tool (ListTools) and closes the
// session: what a one-off check of a server (talosctl registry lint)
// needs. info is the server's name and version, nil if it gave none. A
// listing error names the server.
func ListServer(ctx context.Context, s Spec, client *mcp.Implementation, opts ...Option) (tools []*mcp.Tool, info *mcp.Implementation, err error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	cs, err := Connect(ctx, s, client, opts...)
	if err != nil {
		return nil, nil, err
	}
	defer cs.Close()
	if tools, err = ListTools(ctx, cs); err != nil {
		return nil, nil, fmt.Errorf("server %q: %w", s.ServerID, err)
	}
	if o.features != nil {
		f, err := ListFeatures(ctx, cs)
		if err != nil {
			return nil, nil, fmt.Errorf("server %q: %w", s.ServerID, err)
		}
		o.features(f)
	}
	if r := cs.InitializeResult(); r != nil {
		info = r.ServerInfo
	}
	return tools, info, nil
}

// Features are the prompts, resources and resource templates a server
// lists.
type Features struct {
	Prompts   []*mcp.Prompt
	Resources []*mcp.Resource
	Templates []*mcp.ResourceTemplate
}

// WithFeatures has ListServer also list the server's prompts, resources
// and resource templates (ListFeatures) and hand them to f.
func WithFeatures(f func([]*mcp.Prompt, []*mcp.Resource, []*mcp.ResourceTemplate)) Option {
	return func(o *options) {
		o.features = func(l Features) { f(l.Prompts, l.Resources, l.Templates) }
	}
}

// ListFeatures lists what cs's server announced besides tools: its
// prompts, resources and resource templates (a server without templates
// may answer that method not found).
func ListFeatures(ctx context.Context, cs *mcp.ClientSession) (Features, error) {
	var f Features
	caps := &mcp.ServerCapabilities{}
	if r := cs.InitializeResult(); r != nil && r.Capabilities != nil {
		caps = r.Capabilities
	}
	if caps.Prompts != nil {
		for p, err := range cs.Prompts(ctx, nil) {
			if err != nil {
				return f, fmt.Errorf("mcpup: prompts/list: %w", err)
			}
			f.Prompts = append(f.Prompts, p)
		}
	}
	if caps.Resources == nil {
		return f, nil
	}
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			return f, fmt.Errorf("mcpup: resources/list: %w", err)
		}
		f.Resources = append(f.Resources, r)
	}
	for t, err := range cs.ResourceTemplates(ctx, nil) {
		var je *jsonrpc.Error
		if errors.As(err, &je) && je.Code == jsonrpc.CodeMethodNotFound {
			break
		}
		if err != nil {
			return f, fmt.Errorf("mcpup: resources/templates/list: %w", err)
		}
		f.Templates = append(f.Templates, t)
	}
	return f, nil
}

// ClientCapabilities are the client capabilities Talos declares to an
// upstream server: roots, sampling and elicitation (form and URL), which
// the gateway relays to its own client. A server may offer some tools
// only to a client that declares these, so every Talos client of an
// upstream (the gateway, registry lint) declares the same and sees the
// same tools.
func ClientCapabilities() *mcp.ClientCapabilities {
	return &mcp.ClientCapabilities{
		RootsV2:     &mcp.RootCapabilities{},
		Sampling:    &mcp.SamplingCapabilities{},
		Elicitation: &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}, URL: &mcp.URLElicitationCapabilities{}},
	}
}
