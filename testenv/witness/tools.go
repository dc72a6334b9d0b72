//go:build tools

// The witness binary itself, which testenv builds from this module beside
// this command.
package main

import _ "filippo.io/torchwood/cmd/litewitness"
