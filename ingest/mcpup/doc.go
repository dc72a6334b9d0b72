// Package mcpup is how Talos talks to an upstream MCP server: it parses the
// `<server_id>=<url|command>` spec operators write, connects over streamable
// HTTP or stdio with the official MCP Go SDK, lists every tool, and reads or
// narrows the action enum of an action-based tool's input schema
// (CM-COMPLETE, the completeness check, and CM-WRAPPER, the read-only
// wrapper's schema "belt").
//
// Callers are the MCP gateway (ingest/gateway, which proxies calls to the
// upstream), `talosctl registry lint` (which compares a registry manifest
// with the live tools/list) and `talosctl bench-mcp`. The package holds no
// state: each Connect is one session the caller owns and closes.
package mcpup
