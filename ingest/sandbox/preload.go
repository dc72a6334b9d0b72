package sandbox

import _ "embed" // node-preload.cjs

//go:embed node-preload.cjs
var nodePreload string

// NodePreload is the script a sandbox with an egress allowlist has Node
// load before a server's own code (NODE_OPTIONS --require, read-only inside
// the sandbox): Node's built-in fetch() ignores HTTP(S)_PROXY before Node
// 24, and the script makes it use them through the npm undici (6.13 or
// later) installed beside the server. Without that undici it changes
// nothing and says so on stderr: fetch() then has no network. Tests that
// run a Node server the way the sandbox does use it.
func NodePreload() string { return nodePreload }
