// Package testenv starts real dependencies for tests and `talosd dev`: an
// embedded NATS server with JetStream and a private clickhouse-server process.
//
// Everything listens on 127.0.0.1 only, on ports picked at start, with its
// data in a directory the caller gives (or a temporary one), so several
// environments can run side by side in one test binary.
package testenv
