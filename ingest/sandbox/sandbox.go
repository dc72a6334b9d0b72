package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/talos-audit/talos/schemas"
)

// ErrSetup is wrapped by every error New returns: the sandbox cannot be set
// up, and the server MUST NOT be started without it.
var ErrSetup = errors.New("sandbox: cannot set up the sandbox")

// Config describes one server's sandbox. The zero value of each optional
// field means its default; New validates it once.
type Config struct {
	// ServerID names the server in errors and logs.
	ServerID string
	// Workspace is the absolute path of the one host directory the server
	// may write (bound read-write at the same path; the server starts in
	// it). It must exist and may not be "/".
	Workspace string
	// ReadOnly are further absolute host paths the server sees read-only at
	// the same path: its installation when it is not under /usr (a
	// node_modules tree, a script's directory). They must exist.
	ReadOnly []string
	// Network is true when the registry marks a tool of the server
	// network_outbound (CM-EGRESS); only then may Egress be set.
	Network bool
	// Egress is the allowlist, "host:port" pairs the server may reach
	// through the egress proxy (CSP MUST 8, NET-01). Hosts match as the
	// client names them (case-insensitive); no wildcards. An entry
	// "host:port@ip:port" pins the destination: the proxy connects to that
	// address and never looks the name up (DNS cannot move it).
	Egress []string
	// Init is the host path of an executable that runs RunInit when its
	// first argument is InitCommand (the gateway's own executable). Needed
	// only with Egress.
	Init string
	// Bwrap is the bubblewrap program (default "bwrap", looked up on PATH).
	Bwrap string
	// Logger receives the egress proxy's refusals (default: discard).
	Logger *slog.Logger
}

// Sandbox is one server's prepared sandbox: bwrap found and tried, the
// egress proxy (if any) listening. Wrap may be called for each start of the
// server; Close stops the proxy after the server has exited.
type Sandbox struct {
	cfg     Config
	bwrap   string
	dir     string // private directory of the proxy's socket and the Node preload
	proxy   *egressProxy
	preload string // host path of the Node preload (with the proxy)
}

// Paths inside the sandbox.
const (
	initPath    = "/run/talos/init"
	socketPath  = "/run/talos/egress.sock"
	preloadPath = "/run/talos/node-preload.cjs"
	// ProxyAddr is where the init listens inside the sandbox's own network
	// namespace; the server's HTTP(S)_PROXY points there.
	ProxyAddr = "127.0.0.1:3128"
	// sandboxPATH is the server's PATH.
	sandboxPATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// systemPaths are bound read-only when the host has them: programs,
// libraries and the few files of /etc that the dynamic loader, TLS and name
// lookups read. Nothing under /home, /root, /var, /srv, /opt or /mnt is
// visible unless named in Config.ReadOnly.
var systemPaths = []string{
	"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
	"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
	"/etc/ssl", "/etc/ca-certificates", "/etc/pki", "/etc/nsswitch.conf", "/etc/hosts",
	"/etc/passwd", "/etc/group", "/etc/localtime",
}

// New validates c, finds bwrap, runs a trial sandbox with the same
// boundaries (so a kernel that refuses user namespaces fails here, not at
// the first call), and starts the egress proxy when c.Egress is set. Every
// error wraps ErrSetup.
func New(ctx context.Context, c Config) (*Sandbox, error) {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%w for server %q: %v", ErrSetup, c.ServerID, err)
	}
	name := c.Bwrap
	if name == "" {
		name = "bwrap"
	}
	bwrap, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("%w for server %q: bubblewrap not found (%v): install it (Debian/Ubuntu: apt-get install bubblewrap)", ErrSetup, c.ServerID, err)
	}
	s := &Sandbox{cfg: c, bwrap: bwrap}
	if err := s.try(ctx); err != nil {
		return nil, fmt.Errorf("%w for server %q: %v", ErrSetup, c.ServerID, err)
	}
	if len(c.Egress) > 0 {
		if err := s.startProxy(); err != nil {
			return nil, fmt.Errorf("%w for server %q: egress proxy: %v", ErrSetup, c.ServerID, err)
		}
	}
	return s, nil
}

func (c *Config) validate() error {
	if !schemas.ValidID(c.ServerID) {
		return fmt.Errorf("server_id %q must match %s", c.ServerID, schemas.IDPattern)
	}
	if c.Workspace == "" {
		return errors.New("no workspace is configured")
	}
	ws, err := existingAbs("workspace", c.Workspace)
	if err != nil {
		return err
	}
	if st, _ := os.Stat(ws); !st.IsDir() {
		return fmt.Errorf("workspace %s is not a directory", ws)
	}
	if ws == "/" {
		return errors.New("the workspace may not be /")
	}
	c.Workspace = ws
	for i, p := range c.ReadOnly {
		if c.ReadOnly[i], err = existingAbs("read-only path", p); err != nil {
			return err
		}
	}
	if len(c.Egress) > 0 && !c.Network {
		return errors.New("an egress allowlist is configured, but the registry marks no tool of the server network_outbound")
	}
	for _, e := range c.Egress {
		if _, _, err := parseEgress(e); err != nil {
			return fmt.Errorf("egress %q: %v", e, err)
		}
	}
	if len(c.Egress) > 0 {
		if c.Init == "" {
			return errors.New("an egress allowlist needs the init program (Config.Init)")
		}
		if _, err := existingAbs("init program", c.Init); err != nil {
			return err
		}
	}
	return nil
}

// existingAbs is p cleaned, which must be absolute and exist.
func existingAbs(what, p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%s %q is not an absolute path", what, p)
	}
	p = filepath.Clean(p)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s: %v", what, err)
	}
	return p, nil
}

// parseHostPort checks one allowlist entry and returns it normalised
// (lower-case host).
func parseHostPort(e string) (string, error) {
	host, port, err := net.SplitHostPort(e)
	if err != nil {
		return "", errors.New("want host:port")
	}
	n, err := strconv.Atoi(port)
	if host == "" || err != nil || n < 1 || n > 65535 {
		return "", errors.New("want host:port with a port from 1 to 65535")
	}
	return net.JoinHostPort(strings.ToLower(host), port), nil
}

// parseEgress checks one allowlist entry, "host:port" or
// "host:port@ip:port", and returns the destination normalised and the
// address the proxy dials for it (the destination itself when not pinned).
func parseEgress(e string) (dest, addr string, err error) {
	dest, pin, pinned := strings.Cut(e, "@")
	if dest, err = parseHostPort(dest); err != nil {
		return "", "", err
	}
	if !pinned {
		return dest, dest, nil
	}
	host, _, err := net.SplitHostPort(pin)
	if err != nil || net.ParseIP(host) == nil {
		return "", "", errors.New("want host:port@ip:port: the pinned address must be an IP address and a port")
	}
	if addr, err = parseHostPort(pin); err != nil {
		return "", "", err
	}
	return dest, addr, nil
}

// try runs /bin/true (as found on the host) inside a sandbox with the same
// boundaries the server will get.
func (s *Sandbox) try(ctx context.Context) error {
	truePath, err := exec.LookPath("true")
	if err != nil {
		return fmt.Errorf("no 'true' program to try the sandbox with: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	args := Args(Layout{Workspace: s.cfg.Workspace, ReadOnly: s.cfg.ReadOnly}, []string{truePath})
	cmd := exec.CommandContext(ctx, s.bwrap, args...)
	cmd.Env = []string{"PATH=" + sandboxPATH}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 500 {
			msg = msg[:500] + "…"
		}
		return fmt.Errorf("bwrap could not start a sandboxed process (%v: %s); if it cannot create namespaces, "+
			"the kernel may refuse unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone, "+
			"kernel.apparmor_restrict_unprivileged_userns)", err, msg)
	}
	return nil
}

// Wrap turns the server's command (argv[0] resolved on the host) and its
// declared environment ("KEY=VALUE") into the bwrap command that runs it
// confined, and that command's environment: PATH, HOME and TMPDIR, the
// proxy variables when there is an egress allowlist, then env (later
// entries win). Nothing else of the gateway's environment is passed, and
// the values never appear on a command line. It is mcpup.Spec.Wrap.
func (s *Sandbox) Wrap(argv, env []string) ([]string, []string, error) {
	if len(argv) == 0 {
		return nil, nil, errors.New("sandbox: empty command")
	}
	l := Layout{Workspace: s.cfg.Workspace, ReadOnly: s.cfg.ReadOnly}
	base := []string{"PATH=" + sandboxPATH, "HOME=/tmp", "TMPDIR=/tmp"}
	if s.proxy != nil {
		l.Init, l.Socket, l.Preload = s.cfg.Init, s.proxy.path, s.preload
		u := "http://" + ProxyAddr
		base = append(base, "HTTP_PROXY="+u, "HTTPS_PROXY="+u, "http_proxy="+u, "https_proxy="+u,
			"ALL_PROXY="+u, "all_proxy="+u, "NO_PROXY=", "no_proxy=", "NODE_USE_ENV_PROXY=1")
		env = withNodePreload(env)
	}
	return append([]string{s.bwrap}, Args(l, argv)...), append(base, env...), nil
}

// withNodePreload is env with NODE_OPTIONS requiring the Node preload
// (NodePreload) before any NODE_OPTIONS env declares.
func withNodePreload(env []string) []string {
	opt := "--require " + preloadPath
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "NODE_OPTIONS="); ok {
			opt += " " + v
			continue
		}
		out = append(out, kv)
	}
	return append(out, "NODE_OPTIONS="+opt)
}

// Close stops the egress proxy and removes its socket. Call it after the
// server has exited.
func (s *Sandbox) Close() error {
	if s.proxy != nil {
		s.proxy.close()
	}
	if s.dir != "" {
		return os.RemoveAll(s.dir)
	}
	return nil
}

// Layout is what Args mounts besides the system paths.
type Layout struct {
	Workspace string   // bound read-write; the working directory
	ReadOnly  []string // bound read-only at the same paths
	// Init and Socket are set together for a server with an egress
	// allowlist: Init (the host's executable) runs as the sandbox's init,
	// relaying ProxyAddr to the proxy's Unix socket Socket.
	Init, Socket string
	// Preload is the host file of NodePreload, bound read-only for a
	// server with an egress allowlist; empty: none.
	Preload string
}

// Args is bwrap's argument list for running argv confined to l: every
// namespace unshared (network included: only loopback exists inside), the
// sandbox dies with the gateway and has no controlling terminal, all
// capabilities dropped, the system paths and l.ReadOnly read-only, a fresh
// /proc, a minimal /dev, a private /tmp, the workspace read-write, and the
// root remounted read-only so nothing else is writable.
func Args(l Layout, argv []string) []string {
	a := []string{"--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"}
	for _, p := range systemPaths {
		a = append(a, "--ro-bind-try", p, p)
	}
	a = append(a, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp")
	for _, p := range l.ReadOnly {
		a = append(a, "--ro-bind", p, p)
	}
	a = append(a, "--bind", l.Workspace, l.Workspace)
	if l.Init != "" {
		a = append(a, "--ro-bind", l.Init, initPath, "--bind", l.Socket, socketPath)
	}
	if l.Preload != "" {
		a = append(a, "--ro-bind", l.Preload, preloadPath)
	}
	a = append(a, "--remount-ro", "/", "--chdir", l.Workspace, "--")
	if l.Init != "" {
		a = append(a, initPath, InitCommand, ProxyAddr, socketPath, "--")
	}
	return append(a, argv...)
}

// AllowlistSHA256 names an egress allowlist in receipts
// (schemas.UpstreamSandbox.AllowlistSHA256): "sha256:" and the hex sha256
// of its entries normalised ("host:port" with the host in lower case, and
// "@ip:port" after it when pinned), sorted, without duplicates, each
// followed by a newline. The entries must be valid (New checks them).
func AllowlistSHA256(egress []string) string {
	entries := make([]string, 0, len(egress))
	for _, e := range egress {
		dest, addr, _ := parseEgress(e)
		if addr != dest {
			dest += "@" + addr
		}
		entries = append(entries, dest)
	}
	slices.Sort(entries)
	h := sha256.New()
	for _, e := range slices.Compact(entries) {
		h.Write([]byte(e + "\n"))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Record is how the sandbox's server runs, as its calls' envelopes and
// receipts say (upstream_sandbox): sandboxed, with no network, or with its
// egress allowlist named by AllowlistSHA256.
func (s *Sandbox) Record() schemas.UpstreamSandbox {
	if len(s.cfg.Egress) == 0 {
		return schemas.UpstreamSandbox{Sandboxed: true, Network: schemas.SandboxNetworkNone}
	}
	return schemas.UpstreamSandbox{Sandboxed: true, Network: schemas.SandboxNetworkAllowlist, AllowlistSHA256: AllowlistSHA256(s.cfg.Egress)}
}
