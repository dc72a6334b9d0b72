// Package sandbox confines the stdio upstream MCP servers the gateway starts
// (CSP MUST 8: sandbox boundaries). Each server runs under bubblewrap
// (`bwrap`) in fresh user, pid, ipc, uts, cgroup, mount and network
// namespaces: its workspace is the only host directory it can write, the
// system directories and the paths an operator names are mounted read-only,
// nothing else of the host is visible, /tmp is private, and the environment
// is exactly what the gateway declares.
//
// Network: a sandboxed server has no route out of its network namespace.
// A server whose registry entry marks a tool network_outbound may reach the
// host:port pairs of its egress allowlist, and only those, through an HTTP
// proxy (CONNECT, or absolute-form requests) that the gateway serves on a
// Unix socket bound into the sandbox; inside, a small init (RunInit, the
// gateway's own executable) listens on the sandbox's loopback and relays to
// that socket, and the server is pointed at it with HTTP(S)_PROXY. A client
// that ignores the proxy variables simply has no network; Node, whose
// built-in fetch() ignores them before Node 24, is given a preload
// (NodePreload) that makes fetch() use them through the npm undici
// installed beside the server.
//
// A sandbox that cannot be set up (bwrap missing, namespaces refused, a bad
// workspace) is an error from New: the caller MUST NOT start the server
// unconfined instead.
//
// The gateway uses it through ForUpstreams: New per stdio upstream,
// Sandbox.Wrap as the upstream's mcpup.Spec.Wrap, Set.Close at exit; its
// main calls ExitIfInit first, which runs RunInit when it was started as
// InitCommand.
package sandbox
